//! `pgscale`: the database engine at a larger size. From a database
//! where `scifact` was ingested with `BENCH_ENGINE=postgres` (the
//! `scifact` run), makes collection `scifact-xN` of `BENCH_COPIES` (6)
//! copies of its documents, each chunk's vector moved by N(0, 0.02²) noise
//! on every component and normalized — as the in-memory engine's `vectors`
//! and `startup` runs make theirs, so both engines are measured on vectors
//! that cluster alike (a copy's cosine to its original ≈ 0.93, to another
//! copy ≈ 0.87) — and each
//! document with a `bucket` (0–99) for filters, then prints: the HNSW
//! index's build time, dense recall@10 against an exact scan (unfiltered,
//! 10 % and 1 % filters) through the engine's own search, and dense,
//! hybrid and lexical latency at one and four concurrent clients.
//! `BENCH_RECALL_QUERIES` (100) sets how many queries measure recall,
//! every 97th chunk vector of SciFact from `BENCH_QUERY_OFFSET` (0): the
//! engine's limits were chosen on offset 0, so another offset (below 97)
//! is a set of queries they were not chosen on;
//! `BENCH_EF_SEARCHES` (a list, default the engine's) the `ef_search`
//! values whose recall and latency it compares; `BENCH_HYBRID_ONLY` skips
//! recall and the dense runs, `BENCH_RANKING_ONLY` runs only the BM25
//! ranking of 30 on one client. After the copies it builds the BM25 index
//! again as the service's upkeep would (`BENCH_BM25_UPKEEP=0`: not).

use crate::env_usize;
use crate::stats::pct;
use ragtime_core::Filter;
use ragtime_pipeline::RequestBudget;
use ragtime_pipeline::corpus::{
    DEFAULT_EF_SEARCH, database_limits, database_retriever, ef_search_for, lexical_depth,
};
use ragtime_pipeline::search::{self, Mode, SEARCH_PLAN, SearchRequest};
use ragtime_store::search::HNSW_BUILD;
use ragtime_store::{SearchLimits, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(30));

pub async fn pg_scale() {
    let url = std::env::var("BENCH_DATABASE_URL")
        .expect("pgscale needs BENCH_DATABASE_URL (a database where `scifact` ran with BENCH_ENGINE=postgres)");
    let copies = env_usize("BENCH_COPIES", 6);
    let store = Store::open(&url).await.expect("store");
    store
        .enable_database_search(384)
        .await
        .expect("the database engine");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let source = store
        .collection_id("scifact")
        .await
        .expect("lookup")
        .expect("run `scifact` with BENCH_ENGINE=postgres on this database first");
    let name = format!("scifact-x{copies}");
    let big = match store.collection_id(&name).await.expect("lookup") {
        Some(id) => id,
        None => make_copies(&store, &pool, source, &name, copies).await,
    };
    crate::keep_bm25_fresh(&store).await;
    // The collection's counts, as the store's writes keep them (the
    // copies are made by SQL; the engine sizes its list from them).
    sqlx::query(
        "UPDATE collections SET documents = (SELECT count(*) FROM documents WHERE collection_id = $1), \
         chunks = (SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.collection_id = $1) \
         WHERE id = $1",
    )
    .bind(big)
    .execute(&pool)
    .await
    .expect("counts");
    let (docs, chunks): (i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT d.id), count(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.collection_id = $1",
    )
    .bind(big)
    .fetch_one(&pool)
    .await
    .expect("count");
    // The engine's own list for this database (it grows with the chunks
    // every collection holds: they share one graph).
    let total = store.total_usage().await.expect("usage").chunks;
    let engine_ef = ef_search_for(DEFAULT_EF_SEARCH, 0, usize::try_from(total).unwrap_or(0));
    let limits = database_limits(engine_ef, 10, &Filter::All, TIMEOUT);
    println!(
        "\n## the database engine at {chunks} chunks ({docs} documents, collection {name}; ef_search {engine_ef} for the {total} chunks in the database)"
    );
    // Queries: chunk vectors of the source collection.
    let offset = env_usize("BENCH_QUERY_OFFSET", 0);
    println!("queries: every 97th SciFact chunk vector from {offset}");
    let queries: Vec<Vec<f32>> = store
        .index_chunks_in(source)
        .await
        .expect("chunks")
        .into_iter()
        .skip(offset)
        .step_by(97)
        .take(env_usize("BENCH_RECALL_QUERIES", 100))
        .map(|c| c.embedding)
        .collect();
    let filters = [
        ("unfiltered", serde_json::Value::Null),
        ("10 % filter", serde_json::json!({"bucket": {"$lt": 10}})),
        // An equality the metadata index answers but too broad to rank
        // exactly: what the bounded count costs before the walk.
        (
            "10 % equality filter",
            serde_json::json!({"bucket": {"$in": [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]}}),
        ),
        ("1 % filter", serde_json::json!({"bucket": 3})),
        (
            "1 % range filter",
            serde_json::json!({"bucket": {"$gte": 99}}),
        ),
    ];
    // ef_search chosen by measured recall and latency: each value's recall
    // against an exact scan and its dense latency at four clients. `None`:
    // the engine's own limits for each filter.
    let efs: Vec<Option<usize>> = match std::env::var("BENCH_EF_SEARCHES") {
        Ok(list) => list
            .split(',')
            .map(|e| Some(e.trim().parse().expect("BENCH_EF_SEARCHES: numbers")))
            .collect(),
        Err(_) => vec![None],
    };
    // The engine's limits for `filter`, or the swept list (and no exact
    // ranking unless BENCH_EXACT_BELOW asks for it).
    let limits_for = |ef: Option<usize>, filter: &Filter| match ef {
        None => database_limits(engine_ef, 10, filter, TIMEOUT),
        Some(ef) => SearchLimits {
            ef_search: ef,
            exact_below: env_usize("BENCH_EXACT_BELOW", 0),
            ..limits
        },
    };
    let store = Arc::new(store);
    let queries = Arc::new(queries);
    // `BENCH_HYBRID_ONLY`: the hybrid and lexical runs alone (no recall,
    // no dense latencies).
    if std::env::var_os("BENCH_HYBRID_ONLY").is_none() {
        let all = AllVectors::load(&pool, big).await;
        let mut exact = Vec::new();
        for (_, f) in &filters {
            // Which of the hundred buckets the filter passes, by the filter
            // language itself.
            let filter = Filter::parse(f, "filter").expect("filter");
            let passes: Vec<bool> = (0..100)
                .map(|b| filter.matches(&serde_json::json!({ "bucket": b })))
                .collect();
            let pass = |b: i32| usize::try_from(b).is_ok_and(|b| passes.get(b) == Some(&true));
            exact.push(
                queries
                    .iter()
                    .map(|q| all.nearest(q, 10, &pass))
                    .collect::<Vec<_>>(),
            );
        }
        drop(all);
        for &ef in &efs {
            let setting = ef.map_or_else(
                || {
                    format!(
                        "the engine's limits (ef_search {engine_ef}, filtered 1000, exact below {})",
                        limits.exact_below
                    )
                },
                |ef| format!("ef_search {ef}"),
            );
            for ((label, f), exact) in filters.iter().zip(&exact) {
                let filter = Filter::parse(f, "filter").expect("filter");
                let limits = limits_for(ef, &filter);
                let t = Instant::now();
                let (mut strict, mut tolerant) = (0.0, 0.0);
                for (q, exact) in queries.iter().zip(exact) {
                    let found = store
                        .dense_search(big, q, 10, &filter, limits)
                        .await
                        .expect("dense");
                    let (s, t) = recall_at_10(&found, exact);
                    strict += s;
                    tolerant += t;
                }
                let n = queries.len() as f64;
                println!(
                    "{setting}: dense recall@10 against an exact scan, {label}: {:.3} by id, {:.3} within 1e-3 of the tenth distance ({:.1} ms a query, 1 client)",
                    strict / n,
                    tolerant / n,
                    t.elapsed().as_secs_f64() * 1000.0 / n
                );
            }
            if efs.len() > 1 {
                let all = Arc::new(Filter::All);
                let limits = limits_for(ef, &Filter::All);
                let (mut times, qps) = dense_latency(&store, &queries, big, &all, 4, limits).await;
                println!(
                    "{setting}: dense, unfiltered, 4 clients: p50 {:.1} ms  p99 {:.1} ms  {qps:.0} queries/s",
                    pct(&mut times, 50.0),
                    pct(&mut times, 99.0)
                );
            }
        }
        for (label, f) in &filters {
            let filter = Arc::new(Filter::parse(f, "filter").expect("filter"));
            let limits = database_limits(engine_ef, 10, &filter, TIMEOUT);
            for clients in [1, 4] {
                let (mut times, qps) =
                    dense_latency(&store, &queries, big, &filter, clients, limits).await;
                println!(
                    "dense, {label}, {clients} client(s): p50 {:.1} ms  p99 {:.1} ms  {qps:.0} queries/s",
                    pct(&mut times, 50.0),
                    pct(&mut times, 99.0)
                );
            }
        }
    }
    let words = Arc::new(query_texts());
    // `BENCH_RANKING_ONLY`: the ranking of 30 on one client, nothing else.
    if std::env::var("BENCH_RANKING_ONLY").is_ok() {
        ranking_latency(&store, big, &words, 30, 1, limits).await;
        return;
    }
    // Hybrid as a request retrieves a top 10, through the pipeline's
    // retrieve stage and the engine's retriever: dense 100 chunks and the
    // lexical ranking side by side (the lexical side then reading its top
    // documents' passages), fused, then the passages of the fused top
    // documents not read yet.
    for clients in [1, 4] {
        let (s, w, q) = (store.clone(), words.clone(), queries.clone());
        let (mut times, qps) = concurrently(clients, 200, move |i| {
            let (s, w, q) = (s.clone(), w.clone(), q.clone());
            async move {
                let retriever = database_retriever((*s).clone(), big, engine_ef);
                let budget = RequestBudget::start(&crate::bench_profile(), &SEARCH_PLAN, None);
                let req = SearchRequest {
                    query: w[i % w.len()].clone(),
                    top_k: 10,
                    mode: Mode::Hybrid,
                    filter: Filter::All,
                };
                let v = Arc::new(q[i % q.len()].clone());
                let out = search::retrieve(&budget, retriever.as_ref(), &req, Some(v), 10).await;
                assert!(!out.partial(), "{:?}", out.report);
                assert!(!out.hits.is_empty(), "hybrid found nothing");
            }
        })
        .await;
        println!(
            "hybrid top 10 through the pipeline (dense 100 chunks + lexical {} documents, passages of the documents shown), {clients} client(s): p50 {:.1} ms  p99 {:.1} ms  {qps:.0} queries/s",
            lexical_depth(100),
            pct(&mut times, 50.0),
            pct(&mut times, 99.0)
        );
    }
    // The same two sides with every lexical document's chunks scored (as
    // the engine did before it read passages apart), for comparison.
    for clients in [1, 4] {
        let (s, w, q) = (store.clone(), words.clone(), queries.clone());
        let (mut times, qps) = concurrently(clients, 120, move |i| {
            let (s, w, q) = (s.clone(), w.clone(), q.clone());
            async move {
                let (text, v) = (&w[i % w.len()], &q[i % q.len()]);
                let (dense, lexical) = tokio::join!(
                    s.dense_search(big, v, 100, &Filter::All, limits),
                    s.lexical_documents(big, text, 100, &Filter::All, Some(v), limits)
                );
                dense.expect("dense");
                lexical.expect("lexical");
            }
        })
        .await;
        println!(
            "hybrid (dense 100 chunks + lexical 100 documents with their chunks), {clients} client(s): p50 {:.1} ms  p99 {:.1} ms  {qps:.0} queries/s",
            pct(&mut times, 50.0),
            pct(&mut times, 99.0)
        );
    }
    // The BM25 ranking alone (no chunks) at the pipeline's depth and
    // shallower: what the index's walk costs by how many it ranks.
    for depth in [100, 50, 30] {
        for clients in [1, 4] {
            ranking_latency(&store, big, &words, depth, clients, limits).await;
        }
    }
    for clients in [1, 4] {
        let (s, w) = (store.clone(), words.clone());
        let (mut times, qps) = concurrently(clients, 60, move |i| {
            let (s, w) = (s.clone(), w.clone());
            async move {
                let text = &w[i % w.len()];
                s.lexical_documents(big, text, 100, &Filter::All, None, limits)
                    .await
                    .expect("lexical");
            }
        })
        .await;
        println!(
            "lexical ({:?}), top 100 documents, {clients} client(s): p50 {:.1} ms  p99 {:.1} ms  {qps:.0} queries/s",
            store.lexical_ranking().expect("enabled"),
            pct(&mut times, 50.0),
            pct(&mut times, 99.0)
        );
    }
}

/// Copies the source collection's documents `copies` times (vectors
/// perturbed, a `bucket` each), and rebuilds the HNSW index (timed).
async fn make_copies(
    store: &Store,
    pool: &sqlx::PgPool,
    source: i64,
    name: &str,
    copies: usize,
) -> i64 {
    let big = store.ensure_collection(name).await.expect("collection");
    let t = Instant::now();
    let now = ragtime_store::now_ms();
    let steps = [
        "DROP INDEX IF EXISTS chunks_dense_hnsw".to_owned(),
        format!(
            "CREATE TEMP TABLE docmap AS SELECT d.id AS old_id, k, nextval('documents_id_seq') AS new_id, d.external_id, d.title \
             FROM documents d, generate_series(0, {}) k WHERE d.collection_id = {source}",
            copies - 1
        ),
        // Written now, as the service's writes stamp them (the BM25
        // upkeep counts them).
        format!(
            "INSERT INTO documents (id, collection_id, external_id, title, metadata, content_hash, updated_ms) \
             SELECT new_id, {big}, external_id || '#' || k, title, json_build_object('bucket', (old_id * 7 + k * 13) % 100)::text, 'copy', {now} FROM docmap"
        ),
        "INSERT INTO chunks (document_id, position, section, text, tokens, embedding, dense) \
         SELECT m.new_id, c.position, c.section, c.text, c.tokens, ''::bytea, \
         l2_normalize((SELECT array_agg(x + random_normal(0, 0.02)::real ORDER BY i) FROM unnest(c.dense::real[]) WITH ORDINALITY u(x, i))::halfvec) \
         FROM docmap m JOIN chunks c ON c.document_id = m.old_id"
            .to_owned(),
        format!(
            "UPDATE documents SET tsv = setweight(to_tsvector('english', title), 'A') || to_tsvector('english', b.words), \
             body = CASE WHEN to_regclass('documents_bm25') IS NULL THEN NULL ELSE title || ' ' || b.words END \
             FROM (SELECT d.id AS doc, COALESCE(string_agg(c.section || ' ' || c.text, ' ' ORDER BY c.position), '') AS words \
                   FROM documents d JOIN chunks c ON c.document_id = d.id WHERE d.collection_id = {big} GROUP BY d.id) b \
             WHERE documents.id = b.doc"
        ),
    ];
    let mut conn = pool.acquire().await.expect("connection");
    sqlx::query("ALTER TABLE documents ADD COLUMN IF NOT EXISTS body text")
        .execute(&mut *conn)
        .await
        .expect("body");
    for sql in steps {
        sqlx::query(&sql)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    println!("\n## copies made in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    sqlx::query("SET maintenance_work_mem = '3GB'")
        .execute(&mut *conn)
        .await
        .expect("set");
    sqlx::query(&format!(
        "CREATE INDEX chunks_dense_hnsw ON chunks USING hnsw ((dense::halfvec(384)) halfvec_cosine_ops) WITH ({HNSW_BUILD})"
    ))
    .execute(&mut *conn)
    .await
    .expect("hnsw");
    println!(
        "HNSW index ({HNSW_BUILD}) built over every chunk in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    sqlx::query("ANALYZE")
        .execute(&mut *conn)
        .await
        .expect("analyze");
    big
}

/// Every chunk of the collection as the index holds it (the stored
/// half-precision vector, normalized) with its document's `bucket`, read
/// once so that the exact nearest of each query and filter is a scan in
/// this process: the same scan in the database takes ~20 s a query at 1M
/// (every row's vector cast, the join, the metadata parsed).
struct AllVectors {
    ids: Vec<i64>,
    buckets: Vec<i32>,
    /// Row-major, one unit vector per chunk.
    vectors: Vec<f32>,
    dim: usize,
}

impl AllVectors {
    async fn load(pool: &sqlx::PgPool, coll: i64) -> AllVectors {
        use futures::TryStreamExt;
        let t = Instant::now();
        let mut rows = sqlx::query_as::<_, (i64, Vec<f32>, i32)>(
            "SELECT c.id, c.dense::vector::real[], (d.meta->>'bucket')::int \
             FROM chunks c JOIN documents d ON d.id = c.document_id \
             WHERE d.collection_id = $1 AND c.dense IS NOT NULL",
        )
        .bind(coll)
        .fetch(pool);
        let mut all = AllVectors {
            ids: Vec::new(),
            buckets: Vec::new(),
            vectors: Vec::new(),
            dim: 0,
        };
        while let Some((id, v, bucket)) = rows.try_next().await.expect("vectors") {
            all.dim = v.len();
            all.vectors.extend(unit(&v));
            all.ids.push(id);
            all.buckets.push(bucket);
        }
        assert!(!all.ids.is_empty(), "no vectors in collection {coll}");
        eprintln!(
            "read {} vectors for the exact scans in {:.1} s",
            all.ids.len(),
            t.elapsed().as_secs_f64()
        );
        all
    }

    /// The `k` nearest chunks passing `pass` (on the bucket): ids and
    /// cosine distances, nearest first.
    fn nearest(&self, q: &[f32], k: usize, pass: &dyn Fn(i32) -> bool) -> Vec<(i64, f64)> {
        let q = unit(q);
        let mut best: Vec<(f64, i64)> = Vec::with_capacity(k + 1);
        for (i, v) in self.vectors.chunks_exact(self.dim).enumerate() {
            if !pass(self.buckets[i]) {
                continue;
            }
            let dist = 1.0 - f64::from(v.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>());
            if best.len() < k || dist < best[best.len() - 1].0 {
                let at = best.partition_point(|b| b.0 <= dist);
                best.insert(at, (dist, self.ids[i]));
                best.truncate(k);
            }
        }
        best.into_iter().map(|(d, id)| (id, d)).collect()
    }
}

/// `v` scaled to length 1.
fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    v.iter().map(|x| x / norm).collect()
}

/// Recall@10 of `found` against the exact ten, two ways: by id, and as
/// ann-benchmarks counts it (`ann_benchmarks/plotting/metrics.py`: a hit
/// whose distance is within 1e-3 of the exact tenth distance counts), which
/// does not punish a pick among near-ties: half precision stores distances
/// to about 1e-3.
fn recall_at_10(found: &[ragtime_store::search::FoundChunk], exact: &[(i64, f64)]) -> (f64, f64) {
    let Some(&(_, tenth)) = exact.last() else {
        return (1.0, 1.0);
    };
    let ids: Vec<i64> = exact.iter().map(|e| e.0).collect();
    let by_id = found
        .iter()
        .filter(|c| ids.contains(&c.chunk.chunk_id))
        .count();
    let within = found
        .iter()
        .take(exact.len())
        .filter(|c| 1.0 - f64::from(c.similarity) <= tenth + 1e-3)
        .count();
    let n = exact.len() as f64;
    (by_id as f64 / n, within as f64 / n)
}

/// 200 dense top-10 searches of collection `coll` over `clients`
/// concurrent clients: each search's time, and searches per second.
async fn dense_latency(
    store: &Arc<Store>,
    queries: &Arc<Vec<Vec<f32>>>,
    coll: i64,
    filter: &Arc<Filter>,
    clients: usize,
    limits: SearchLimits,
) -> (Vec<Duration>, f64) {
    let (s, q, f) = (store.clone(), queries.clone(), filter.clone());
    concurrently(clients, 200, move |i| {
        let (s, q, f) = (s.clone(), q.clone(), f.clone());
        async move {
            s.dense_search(coll, &q[i % q.len()], 10, &f, limits)
                .await
                .expect("dense");
        }
    })
    .await
}

/// Prints what the BM25 ranking of `depth` documents alone (no chunks)
/// costs at `clients` concurrent clients, 120 searches each.
async fn ranking_latency(
    store: &Arc<Store>,
    big: i64,
    words: &Arc<Vec<String>>,
    depth: usize,
    clients: usize,
    limits: SearchLimits,
) {
    let (s, w) = (store.clone(), words.clone());
    let (mut times, qps) = concurrently(clients, 120, move |i| {
        let (s, w) = (s.clone(), w.clone());
        async move {
            let text = &w[i % w.len()];
            s.ranked_documents(big, text, depth, &Filter::All, limits)
                .await
                .expect("ranked");
        }
    })
    .await;
    println!(
        "lexical ranking alone, top {depth} documents, {clients} client(s): p50 {:.1} ms  p99 {:.1} ms  {qps:.0} queries/s",
        pct(&mut times, 50.0),
        pct(&mut times, 99.0)
    );
}

/// `n` calls of `one(i)` spread over `clients` tasks: each call's time,
/// and the calls per second over the whole run.
async fn concurrently<F, Fut>(clients: usize, n: usize, one: F) -> (Vec<Duration>, f64)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let one = Arc::new(one);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let one = one.clone();
            tokio::spawn(async move {
                let mut times = Vec::new();
                for i in (c..n).step_by(clients) {
                    let t = Instant::now();
                    one(i).await;
                    times.push(t.elapsed());
                }
                times
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.expect("client"));
    }
    let qps = all.len() as f64 / started.elapsed().as_secs_f64();
    (all, qps)
}

/// SciFact's train questions, as lexical queries.
fn query_texts() -> Vec<String> {
    ragtime_testkit::scifact::load_scifact()
        .queries
        .into_iter()
        .take(60)
        .map(|(_, text)| text)
        .collect()
}
