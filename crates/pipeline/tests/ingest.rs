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
    let mut made = corpora(&Store::sqlite_url(dir), 1).await;
    let rag = made.0.pop().expect("one");
    (rag, made.1)
}

/// `n` corpora on the store at `url`, each with a connection pool of its
/// own (replicas on one database), sharing one loaded model.
async fn corpora(url: &str, n: usize) -> (Vec<Rag>, Arc<EmbedService>) {
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
    let chunkers: Vec<_> = (0..n)
        .map(|_| model.chunker(params.max_tokens, params.overlap))
        .collect();
    let svc = Arc::new(EmbedService::new(model, ServiceOptions::default()));
    let mut out = Vec::with_capacity(n);
    for chunker in chunkers {
        let store = Store::open(url).await.expect("store");
        out.push(Rag::new(store, svc.clone(), chunker, params));
    }
    (out, svc)
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
    // (What is left is the running engine's workspace, its BM25 indexes,
    // and the folder's replica name.)
    assert!(
        std::fs::read_dir(saved.path())
            .expect("dir")
            .flatten()
            .all(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("work-") || name == "replica"
            }),
        "the foreign snapshot was removed"
    );
}

/// The newest snapshot's folder under `root`.
fn snapshot_dir(root: &std::path::Path) -> std::path::PathBuf {
    // (`root` holds one folder per collection id, and engines' workspaces.)
    let coll = std::fs::read_dir(root)
        .expect("root")
        .flatten()
        .find(|e| e.file_name().to_string_lossy().parse::<i64>().is_ok())
        .expect("a collection");
    std::fs::read_dir(coll.path())
        .expect("collection")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("snapshot.json").is_file())
        .expect("a snapshot")
}

/// A snapshot with a truncated file, a file with a byte changed, or one a
/// process died loading (its marker left behind), is not loaded: the
/// collection comes from the store.
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
    let data = snapshot_dir(saved.path()).join("dense.usearch");
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
    // A process that died loading it left its marker, named as an older
    // build named it: by its pid, which is this process's own (in a
    // container every start is PID 1).
    let marker = format!("loading-{}", std::process::id());
    std::fs::write(snapshot_dir(saved.path()).join(marker), b"").expect("marker");
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
    drop(d);
    // One byte changed in the middle of a file, its size the same: the
    // graph's links and the chunks' words as the loader would walk them.
    for file in ["dense.usearch", "chunks.texts"] {
        let path = snapshot_dir(saved.path()).join(file);
        let mut bytes = std::fs::read(&path).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x5a;
        std::fs::write(&path, &bytes).expect("write");
        let e = start().await;
        assert_eq!(e.snapshot_loads(), 0, "a damaged {file} is not loaded");
        assert_eq!(e.collection("c").await.expect("c").len(), 6);
        assert_eq!(e.save_snapshots().await.expect("save"), 1, "saved anew");
        drop(e);
        assert_eq!(start().await.snapshot_loads(), 1, "the new one is used");
    }
}

/// The snapshots' disk full during a save (a real tmpfs, mounted small and
/// then filled): the save fails and leaves no half-written folder, the
/// collection answers as before, and once space returns the next save
/// succeeds and a new process loads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, to mount a tmpfs"]
async fn needs_mount_a_save_on_a_full_disk_fails_cleanly_and_the_next_succeeds() {
    use std::io::Write;
    use std::process::Command;
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = tempfile::tempdir().expect("tempdir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(saved.path())
        .status()
        .expect("mount");
    assert!(mounted.success(), "mounting a tmpfs needs root");
    let _unmount = Unmount(saved.path().to_owned());
    let start = || async {
        let rag = rag_at(dir.path())
            .await
            .0
            .with_snapshots(snapshots(saved.path()));
        rag.rebuild().await.expect("rebuild");
        rag.follow().await.expect("follow");
        rag
    };
    let docs: Vec<IngestDoc> = (0..200)
        .map(|i| {
            doc(
                &format!("d{i}"),
                &format!("Note tagd{i} on tides and moons."),
            )
        })
        .collect();
    let a = start().await;
    a.ingest("c", docs).await.expect("ingest");
    a.follow().await.expect("follow");
    // Every byte left is taken.
    let filler = saved.path().join("filler");
    let mut f = std::fs::File::create(&filler).expect("filler");
    let block = vec![7u8; 1 << 16];
    while f.write_all(&block).is_ok() {}
    drop(f);
    assert_eq!(
        a.save_snapshots().await.expect("save"),
        0,
        "nothing is saved on a full disk"
    );
    let mut left = Vec::new();
    for coll in std::fs::read_dir(saved.path()).expect("root").flatten() {
        if coll.path().is_dir() && coll.file_name().to_string_lossy().parse::<i64>().is_ok() {
            left.extend(
                std::fs::read_dir(coll.path())
                    .expect("dir")
                    .flatten()
                    .map(|e| e.file_name()),
            );
        }
    }
    assert!(left.is_empty(), "a failed save leaves nothing: {left:?}");
    assert_indexes_match_store(&a, "c", "after the failed save").await;
    std::fs::remove_file(&filler).expect("space returns");
    assert_eq!(
        a.save_snapshots().await.expect("save"),
        1,
        "saved once space returned"
    );
    drop(a);
    let b = start().await;
    assert_eq!(
        b.snapshot_loads(),
        1,
        "the snapshot saved after the failure is used"
    );
    assert_indexes_match_store(&b, "c", "loaded from it").await;
}

/// Whether `rag`'s loaded indexes of collection `name` hold exactly what
/// the store holds: every stored document with its stored chunks, no
/// deleted one, and each document found by a word of its own.
async fn assert_indexes_match_store(rag: &Rag, name: &str, when: &str) {
    let coll = rag
        .store
        .collection_id(name)
        .await
        .expect("query")
        .expect("collection");
    let stored = rag.store.index_chunks_in(coll).await.expect("chunks");
    let mut by_doc: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for c in &stored {
        by_doc
            .entry(c.external_id.clone())
            .or_default()
            .push(c.chunk_id);
    }
    let idx = rag.collection(name).await.expect("loaded");
    assert_eq!(
        (idx.len(), idx.documents()),
        (stored.len(), by_doc.len()),
        "{when}: the follower's index holds other chunks than the store"
    );
    for (id, mut chunks) in by_doc {
        chunks.sort_unstable();
        let mut held = idx.chunks_of(&id);
        held.sort_unstable();
        assert_eq!(held, chunks, "{when}: document {id}");
        let hits = idx
            .lexical_search(
                &format!("tag{id}"),
                3,
                &ragtime_retrieve::Allowed::All,
                &ragtime_core::Cancel::new(),
            )
            .expect("search");
        let found = hits
            .first()
            .and_then(|h| idx.chunk(h.chunk_id))
            .map(|c| c.external_id.clone());
        assert_eq!(found.as_deref(), Some(id.as_str()), "{when}: tag{id}");
    }
}

/// Two replicas write into one collection at once — one-document ingests
/// and deletes — while a third follows the change log as often as it
/// can. On PostgreSQL an entry's id is taken when it is written and seen
/// at commit, so without writers taking turns at the log a lower id
/// commits after a higher one was read and the follower passes it for
/// ever. After every round the third replica's indexes equal the store's,
/// and again after a restart from the snapshot it saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL (RAGTIME_TEST_DATABASE_URL)"]
async fn needs_postgres_a_follower_misses_no_write_of_concurrent_writers() {
    let db = ragtime_testkit::PgDatabase::create("ragtime_follow").await;
    follower_misses_no_write(&db.url).await;
    db.drop_db().await;
}

/// The same on PostgreSQL 18 with pgvector.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_a_follower_misses_no_write_of_concurrent_writers() {
    let server = ragtime_testkit::PgServer::start();
    let db = ragtime_testkit::PgDatabase::create_on(&server.admin_url, "ragtime_follow").await;
    follower_misses_no_write(&db.url).await;
}

async fn follower_misses_no_write(url: &str) {
    let saved = tempfile::tempdir().expect("tempdir");
    let (mut made, _) = corpora(url, 3).await;
    let follower = Arc::new(
        made.pop()
            .expect("c")
            .with_snapshots(snapshots(saved.path())),
    );
    let (a, b) = (Arc::new(made.remove(0)), Arc::new(made.remove(0)));
    for coll in ["c", "d"] {
        let id = format!("seed{coll}");
        a.ingest(coll, vec![doc(&id, &format!("A seed note tag{id}."))])
            .await
            .expect("seed");
    }
    follower.rebuild().await.expect("rebuild");
    follower.follow().await.expect("follow");
    const ROUNDS: usize = 6;
    const PER_ROUND: usize = 30;
    for round in 0..ROUNDS {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let following = {
            let (f, stop) = (follower.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    f.follow().await.expect("follow");
                }
            })
        };
        // Into two collections: writes into one take turns at its row,
        // so only across collections do commits race for the log.
        let writer = |rag: Arc<Rag>, who: &'static str| async move {
            for i in 0..PER_ROUND {
                let coll = ["c", "d"][i % 2];
                let id = format!("{who}{round}x{i}");
                let text = format!("Note {i} of {who} in round {round}: tag{id}.");
                rag.ingest(coll, vec![doc(&id, &text)])
                    .await
                    .expect("ingest");
                // Every third document of the previous round goes again.
                if round > 0 && i % 3 == 0 {
                    let old = format!("{who}{}x{i}", round - 1);
                    rag.delete(coll, &old).await.expect("delete");
                }
            }
        };
        tokio::join!(writer(a.clone(), "a"), writer(b.clone(), "b"));
        stop.store(true, std::sync::atomic::Ordering::Release);
        following.await.expect("follower");
        // Everything is committed now: one more pass brings the rest.
        follower.follow().await.expect("follow");
        for coll in ["c", "d"] {
            assert_indexes_match_store(&follower, coll, &format!("{coll}, round {round}")).await;
        }
    }
    assert_eq!(follower.save_snapshots().await.expect("save"), 2);
    drop(follower);
    let (mut again, _) = corpora(url, 1).await;
    let again = again
        .pop()
        .expect("one")
        .with_snapshots(snapshots(saved.path()));
    again.rebuild().await.expect("rebuild");
    assert_eq!(again.snapshot_loads(), 2, "loaded from their snapshots");
    for coll in ["c", "d"] {
        assert_indexes_match_store(&again, coll, "after a restart").await;
    }
}

/// An ingest prepared before its collection was removed — and one whose
/// collection was removed and made again — fails naming it: nothing is
/// made again, the new collection gets nothing of it, and its indexes are
/// its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_into_a_collection_removed_meanwhile_fails_cleanly() {
    let (rag, _dir) = rag().await;
    rag.ingest("c", vec![doc("old", "An old note about tagold.")])
        .await
        .expect("ingest");
    let prepared = rag
        .prepare("c", vec![doc("late", "A late note about taglate.")])
        .await
        .expect("prepare");
    assert!(rag.drop_collection("c").await.expect("drop").is_some());
    let err = rag.commit(prepared).await.expect_err("gone");
    assert!(
        matches!(&err, ragtime_pipeline::corpus::CorpusError::UnknownCollection(n) if n == "c"),
        "{err}"
    );
    assert_eq!(
        rag.store.collection_id("c").await.expect("q"),
        None,
        "not made again"
    );

    let prepared = rag
        .prepare("c", vec![doc("late", "A late note about taglate.")])
        .await
        .expect("prepare");
    assert!(rag.drop_collection("c").await.expect("drop").is_some());
    rag.create_collection("c", "made again")
        .await
        .expect("create");
    let err = rag
        .commit(prepared)
        .await
        .expect_err("another collection now");
    assert!(matches!(
        err,
        ragtime_pipeline::corpus::CorpusError::UnknownCollection(_)
    ));
    rag.ingest("c", vec![doc("new", "A new note about tagnew.")])
        .await
        .expect("ingest into the new one");
    let idx = rag.collection("c").await.expect("loaded");
    assert_eq!(idx.len(), 1, "only the new collection's document");
    assert!(idx.chunks_of("late").is_empty() && idx.chunks_of("old").is_empty());
}

/// A collection loading from the store (a second for 10,000 chunks)
/// holds only its own lock: another collection's ingest goes
/// through while it loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_load_does_not_hold_up_another_collections_ingest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (rag, _) = rag_at(dir.path()).await;
    let big = rag.store.ensure_collection("big").await.expect("big");
    // 10,000 stored chunks with made-up unit vectors: loading them (the
    // graph and the BM25 index) takes a second or more, against tens of
    // milliseconds for the small ingest.
    let mut seed = 7u64;
    let mut unit = || {
        let v: Vec<f32> = (0..384)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5
            })
            .collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect::<Vec<f32>>()
    };
    let docs: Vec<ragtime_store::NewDocument> = (0..100)
        .map(|d| ragtime_store::NewDocument {
            external_id: format!("b{d}"),
            title: String::new(),
            metadata: "{}".into(),
            content_hash: format!("h{d}"),
            chunks: (0..100)
                .map(|i| ragtime_store::NewChunk {
                    position: i,
                    section: String::new(),
                    text: format!("chunk {i} of b{d}"),
                    tokens: 4,
                    embedding: unit(),
                })
                .collect(),
        })
        .collect();
    rag.store
        .upsert_documents(big, &docs, None, None)
        .await
        .expect("store");
    drop(rag);
    let rag = Arc::new(rag_at(dir.path()).await.0.with_preload(0));
    rag.rebuild().await.expect("rebuild");
    rag.ingest("small", vec![doc("s0", "A first small note.")])
        .await
        .expect("small");
    let loading = {
        let rag = rag.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let n = rag.collection("big").await.expect("load").len();
            (n, started.elapsed())
        })
    };
    // Long enough for the spawned load to take big's lock; were it later,
    // the ingest would still pass and the load still be running.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!loading.is_finished(), "the load is under way");
    let started = std::time::Instant::now();
    rag.ingest("small", vec![doc("s1", "A second small note.")])
        .await
        .expect("small");
    let ingest = started.elapsed();
    assert!(
        !loading.is_finished(),
        "the ingest waited for the other collection's load ({ingest:?})"
    );
    let (n, load) = loading.await.expect("load");
    assert_eq!(n, 10_000);
    println!("ingest into small: {ingest:?} while big loaded in {load:?}");
    assert_eq!(rag.collection("small").await.expect("small").len(), 2);
}

/// A save that fails at its last step (the rename into place) leaves no
/// half-written folder behind, and the snapshot in place is untouched.
#[test]
fn a_save_failing_at_its_last_step_leaves_nothing() {
    use ragtime_pipeline::snapshots::{self as snap, SnapshotMeta};
    let root = tempfile::tempdir().expect("tempdir");
    let idx = ragtime_retrieve::CollectionIndex::new(4, ragtime_retrieve::DenseParams::default())
        .expect("index");
    idx.add(
        (0..3)
            .map(|i| {
                let c = ragtime_testkit::chunk(
                    i,
                    &format!("d{i}"),
                    "",
                    "a note",
                    serde_json::json!({}),
                );
                (c, vec![1.0, i as f32, 0.5, 0.0])
            })
            .collect(),
    )
    .expect("add");
    let meta = |saved_at_ms| SnapshotMeta {
        format: snap::FORMAT,
        collection_id: 9,
        collection: "c".into(),
        log_position: 5,
        log_at_ms: 1,
        dim: 4,
        chunks: 0,
        documents: 0,
        saved_at_ms,
        files: Default::default(),
        crc32: Default::default(),
        store: String::new(),
    };
    snap::save(root.path(), &idx, meta(100)).expect("first save");
    // The next save's final name is taken by a folder with something in
    // it: the rename fails.
    let blocker = root.path().join("9").join("5.200");
    std::fs::create_dir_all(&blocker).expect("blocker");
    std::fs::write(blocker.join("x"), b"x").expect("blocker file");
    assert!(snap::save(root.path(), &idx, meta(200)).is_err());
    let mut left: Vec<String> = std::fs::read_dir(root.path().join("9"))
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["5.100", "5.200"], "no unfinished save stays");
    let (dir, found) = snap::latest(root.path(), 9).expect("the first one");
    assert_eq!(
        (dir.file_name().and_then(|n| n.to_str()), found.saved_at_ms),
        (Some("5.100"), 100)
    );
    snap::check(&dir, &found).expect("still whole");
}

/// Two replicas on one store: once both passed a change, the log is
/// trimmed below it. A third that fell behind (it never followed) finds
/// the changes it missed trimmed: it drops its indexes and loads the
/// store as it is, so it still holds exactly what the store holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_trimmed_once_every_replica_passed_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = Store::sqlite_url(dir.path());
    let (made, _) = corpora(&url, 3).await;
    let [a, b, late]: [Rag; 3] = made.try_into().ok().expect("three");
    for r in [&a, &b, &late] {
        r.rebuild().await.expect("rebuild");
        r.follow().await.expect("follow");
    }
    a.ingest("c", vec![doc("d0", "First note tagd0.")])
        .await
        .expect("ingest");
    late.collection("c").await.expect("load");
    for i in 1..6 {
        a.ingest(
            "c",
            vec![doc(&format!("d{i}"), &format!("Note {i} tagd{i}."))],
        )
        .await
        .expect("ingest");
    }
    assert!(a.delete("c", "d0").await.expect("delete"));
    let stale = std::time::Duration::from_secs(3600);
    a.follow().await.expect("follow");
    b.follow().await.expect("follow");
    let end = a.store.corpus_version().await.expect("version");
    let position = |r: &Rag| r.resident().expect("in-process").position();
    assert_eq!((position(&a), position(&b)), (end, end));
    // How long since the follower's last pass is told (a stuck follower
    // shows in `/readyz` by it).
    let idle = late.lag().since_pass;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(late.lag().since_pass >= idle + std::time::Duration::from_millis(50));
    assert!(a.lag().since_pass < late.lag().since_pass);
    // `late` has not followed since it loaded: the log waits for it.
    // (It reported its position when it started.)
    let behind = position(&late);
    assert!(behind < end);
    a.keep_log_trimmed(stale).await.expect("a");
    b.keep_log_trimmed(stale).await.expect("b");
    assert_eq!(a.store.log_trimmed_below().await.expect("below"), behind);
    // It goes quiet (as after the stale time): the log is trimmed below
    // the others, past what it needs.
    late.leave().await.expect("leave");
    b.keep_log_trimmed(stale).await.expect("b");
    assert_eq!(a.store.log_trimmed_below().await.expect("below"), end);
    let left = a.store.log_since(0, 100).await.expect("log");
    assert!(
        left.iter().all(|e| e.id >= end),
        "trimmed below both: {left:?}"
    );
    // `late` never followed: the entries it needs are gone.
    late.follow().await.expect("follow");
    assert_indexes_match_store(&late, "c", "after the trim").await;
}

/// A replica's saved snapshots against another replica's trims: a
/// collection that does not change never holds the log back, and its
/// snapshot still loads once its own position's entry is trimmed; a
/// replica that stops and starts again keeps its name and its place in
/// the log, so a collection written to after its save replays from its
/// snapshot instead of loading the store again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_collection_never_holds_the_log_and_a_restart_keeps_its_snapshots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = tempfile::tempdir().expect("tempdir");
    let url = Store::sqlite_url(dir.path());
    let stale = std::time::Duration::from_secs(3600);
    let (made, _) = corpora(&url, 2).await;
    let [a, b]: [Rag; 2] = made.try_into().ok().expect("two");
    let a = a.with_snapshots(snapshots(saved.path()));
    for r in [&a, &b] {
        r.rebuild().await.expect("rebuild");
        r.follow().await.expect("follow");
    }
    a.ingest(
        "quiet",
        vec![doc("q0", "Moss grows on the north side, tagq0.")],
    )
    .await
    .expect("ingest");
    a.ingest(
        "later",
        vec![doc("l0", "Ferns unroll their fronds, tagl0.")],
    )
    .await
    .expect("ingest");
    a.follow().await.expect("follow");
    let saved_at = a.store.corpus_version().await.expect("version");
    assert_eq!(a.save_snapshots().await.expect("save"), 2);
    let position = |r: &Rag| r.resident().expect("in-process").position();
    let name = a.resident().expect("in-process").replica().to_owned();
    // Another replica writes to a collection of its own, many times: the
    // log moves on past both snapshots, neither holds it.
    for i in 0..5 {
        b.ingest("busy", vec![doc(&format!("b{i}"), &format!("Busy {i}."))])
            .await
            .expect("ingest");
    }
    a.follow().await.expect("follow");
    b.follow().await.expect("follow");
    let end = a.store.corpus_version().await.expect("version");
    assert_eq!(position(&a), end, "unchanged collections hold nothing");
    a.keep_log_trimmed(stale).await.expect("a");
    b.keep_log_trimmed(stale).await.expect("b");
    assert_eq!(a.store.log_trimmed_below().await.expect("below"), end);

    // Written to after its save: that snapshot holds the log now.
    a.ingest(
        "later",
        vec![doc("l1", "Horsetails were trees once, tagl1.")],
    )
    .await
    .expect("ingest");
    a.follow().await.expect("follow");
    assert_eq!(
        position(&a),
        saved_at,
        "`later`'s snapshot needs what came after it"
    );
    // A graceful stop: the position stays on record while it is away.
    a.leave().await.expect("leave");
    drop(a);
    for i in 5..8 {
        b.ingest("busy", vec![doc(&format!("b{i}"), &format!("Busy {i}."))])
            .await
            .expect("ingest");
    }
    b.follow().await.expect("follow");
    b.keep_log_trimmed(stale).await.expect("b");
    assert_eq!(
        b.store.log_trimmed_below().await.expect("below"),
        end,
        "the stopped replica's place holds"
    );

    let (a, _) = rag_at(dir.path()).await;
    let a = a.with_snapshots(snapshots(saved.path()));
    assert_eq!(
        a.resident().expect("in-process").replica(),
        name,
        "the same name again"
    );
    a.rebuild().await.expect("rebuild");
    assert_eq!(a.snapshot_loads(), 2, "both from their snapshots");
    for (coll, id) in [("quiet", "q0"), ("later", "l0"), ("later", "l1")] {
        let idx = a.collection(coll).await.expect("collection");
        assert!(!idx.chunks_of(id).is_empty(), "{coll} holds {id}");
    }
    assert_indexes_match_store(&a, "later", "after the restart").await;
    assert_indexes_match_store(&a, "quiet", "after the restart").await;
}
