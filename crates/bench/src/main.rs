//! `ragtime-bench scifact|vectors|cache|embed|ingest|all` — prints figures;
//! asserts nothing.
//!
//! - `ingest`: ingest throughput alone (`BENCH_DOCS` limits the documents;
//!   `BENCH_BATCH_TOKENS` sets the padded tokens per inference).
//! - `rerank`: the shared cross-encoder: nDCG@10 by blend weight and
//!   latency for 10/20/50 candidates (see `rerank_bench`).
//! - `chat`: end-to-end time to first token on the local LLM and semantic
//!   cache-hit latency (see `chat_bench`; not part of `all`).
//! - `cache`: semantic-cache hit and false-hit rates on the Quora pairs
//!   (see `cache_bench`).
//! - `load`, `hedge`, `kill`, `prefix`: the chat path under load, with
//!   hedging, with a backend killed, and with and without the backend's
//!   prompt prefix cache (see `load`; not part of `all`).
//! - `tracing`: search latency with spans off, sampled at 0.1 and all
//!   exported (see `tracing_cost`; not part of `all`).
//! - `scaling`: start-up time, threads and RSS at 10,000 collections, and
//!   memory per empty collection and per 10k chunks (see `scaling`; not
//!   part of `all`).
//!
//! - `flood`: a gzip bomb, an oversized PDF and a flood of concurrent
//!   ingests against `ragtime serve`: the answers and peak RSS (not part
//!   of `all`).
//!
//! - `follow`: a replica's lag behind another ingesting SciFact, on one
//!   PostgreSQL database, and its search latency meanwhile (not part of
//!   `all`).
//!
//! - `pgscale`: the database engine on copies of SciFact (see
//!   `pg_scale`; needs `BENCH_DATABASE_URL`; not part of `all`).
//!
//! - `startup`: time to ready, RSS and a first search with one collection
//!   of 100k and of 1M chunks (`BENCH_STARTUP_CHUNKS`; not part of `all`).
//!
//! - `metadata`: what documents' metadata cost a collection's heap (see
//!   `scaling::metadata`; not part of `all`).
//!
//! - `soak`: an hour of mixed traffic, hostile clients among it, against
//!   `ragtime serve` on SQLite or PostgreSQL: RSS, disk and latency each
//!   minute, and every acknowledged write checked (see `soak`; not part of
//!   `all`).
//!
//! - `fusion`: the rankings' fusion and the document index's title boost
//!   chosen on the train queries (see `fusion_bench`; not part of `all`).
//! - `BENCH_STORE=dir` keeps the ingested SciFact store in `dir` and reuses
//!   it on the next run (`scifact`, `fusion`, `rerank` without re-embedding).
//! - `BENCH_ENGINE=postgres` with `BENCH_DATABASE_URL=postgres://…` (a
//!   database with pgvector) stores and searches SciFact inside PostgreSQL
//!   (`scifact`, `rerank`); `BENCH_EF_SEARCH` sets its least `hnsw.ef_search`.
//!   After the ingest the BM25 index is built again as the service's
//!   upkeep would build it (`BENCH_BM25_UPKEEP=0`: left as the writes
//!   left it).
//!
//! - `scifact`: ingests the BEIR SciFact corpus (`../shared/data/scifact`,
//!   or `RAGTIME_SCIFACT`), reports ingest throughput, and nDCG@10 on the
//!   train queries for lexical, dense and hybrid search (chunks aggregated
//!   to documents by their best rank).
//! - `vectors`: query-embedding p50/p99, batch-32 passage embedding time,
//!   and search latency / QPS / recall@10 at 100k vectors with and without
//!   metadata filters, plus hybrid (dense + BM25 + fusion) latency.

mod answers;
mod cache_bench;
mod chat_bench;
mod flood;
mod follow_bench;
mod fusion_bench;
mod heap;
mod load;
mod pg_scale;
mod rerank_bench;
mod scaling;
mod soak;
mod stats;
mod tracing_cost;

use data::{SciFact, load_scifact};
use ragtime_core::{Cancel, Filter};
use ragtime_embed::{EmbedService, EmbedderOptions, OnnxEmbedder, ServiceOptions};
use ragtime_pipeline::adapters::IndexRetriever;
use ragtime_pipeline::corpus::{ChunkParams, Corpus, IngestDoc};
use ragtime_pipeline::search::{self, Mode, SEARCH_PLAN, SearchDeps, SearchOutcome, SearchRequest};
use ragtime_pipeline::{BudgetProfile, RequestBudget};
use ragtime_retrieve::{Allowed, Chunk, CollectionIndex, DenseParams};
use ragtime_store::Store;
use ragtime_testkit::scifact as data;
use stats::{Rng, ndcg_at_10, pct};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

fn load_model(threads: usize) -> OnnxEmbedder {
    let batch = env_usize("BENCH_BATCH", 32);
    let c = cache();
    OnnxEmbedder::load(&EmbedderOptions {
        model_dir: c.join("models/all-minilm-l6-v2"),
        ort_lib: c.join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: threads,
        max_tokens: 256,
        batch_size: batch,
        max_batch_tokens: env_usize("BENCH_BATCH_TOKENS", 1024),
        passage_int8: env_usize("BENCH_PASSAGE_INT8", 1) == 1,
    })
    .unwrap_or_else(|e| panic!("run `make setup` first: {e}"))
}

/// Generous budgets: the benchmark measures, it does not degrade.
fn bench_profile() -> BudgetProfile {
    BudgetProfile {
        total_ms: 600_000,
        cache_ms: 0,
        embed_ms: 60_000,
        retrieve_ms: 60_000,
        rerank_ms: 0,
        llm_ttft_ms: 0,
        llm_generate_ms: 0,
        quote_ms: 0,
        verify_ms: 0,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let what = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    println!(
        "# ragtime-bench ({} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if what == "cache" || what == "all" {
        cache_bench::semantic_cache(cache_bench::service(load_model(env_usize(
            "BENCH_THREADS",
            2,
        ))))
        .await;
        if what == "cache" {
            return;
        }
    }
    if what == "scaling" {
        scaling::scaling().await;
        return;
    }
    if what == "flood" {
        flood::flood().await;
        return;
    }
    if what == "soak" {
        soak::soak().await;
        return;
    }
    if what == "follow" {
        follow_bench::follow().await;
        return;
    }
    if what == "metadata" {
        scaling::metadata();
        return;
    }
    if what == "startup" {
        scaling::startup().await;
        return;
    }
    if what == "pgscale" {
        pg_scale::pg_scale().await;
        return;
    }
    if what == "answers" {
        answers::answers().await;
        return;
    }
    let data = load_scifact();
    if what == "embed" {
        embed_only(&data).await;
        return;
    }
    if what == "load" || what == "hedge" || what == "kill" || what == "prefix" {
        match what.as_str() {
            "load" => load::load(&data).await,
            "hedge" => load::hedge(&data).await,
            "prefix" => load::prefix(&data).await,
            _ => load::kill(&data).await,
        }
        return;
    }
    if what == "tracing" {
        tracing_cost::tracing_cost(&data).await;
        return;
    }
    if what == "chat" {
        let (rag, _dir) = new_rag().await;
        chat_bench::chat_bench(&rag, &data).await;
        return;
    }
    let (rag, _dir) = ingest_scifact(&data).await;
    if what == "ingest" {
        return;
    }
    if what == "scifact" || what == "all" {
        scifact_quality(&rag, &data).await;
    }
    if what == "fusion" {
        fusion_bench::fusion(&rag, &data).await;
    }
    if what == "vectors" || what == "all" {
        vectors(&rag, &data).await;
    }
    if what == "rerank" || what == "all" {
        rerank_bench::rerank(&rag, &data).await;
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Embedding speed alone, for tuning threads (`BENCH_THREADS`, `BENCH_WORKERS`).
async fn embed_only(data: &SciFact) {
    let threads = env_usize("BENCH_THREADS", 2);
    let workers = env_usize("BENCH_WORKERS", 1);
    let svc = Arc::new(EmbedService::new(
        load_model(threads),
        ServiceOptions {
            workers,
            max_batch: env_usize("BENCH_BATCH", 32),
            ..ServiceOptions::default()
        },
    ));
    let mut times = query_times(&svc, data).await;
    println!(
        "threads {threads} workers {workers}: query p50 {:.2} ms p99 {:.2} ms",
        pct(&mut times, 50.0),
        pct(&mut times, 99.0)
    );
    let passages: Vec<String> = data
        .corpus
        .iter()
        .take(640)
        .map(|(_, t, x)| format!("{t}\n{x}"))
        .collect();
    let t = Instant::now();
    let parts: Vec<_> = passages
        .chunks(32)
        .map(|b| {
            let (svc, b) = (svc.clone(), b.to_vec());
            tokio::spawn(async move { svc.embed_passages(b, Cancel::new()).await })
        })
        .collect();
    for p in parts {
        p.await.expect("join").expect("embed");
    }
    println!(
        "threads {threads} workers {workers}: {} passages (≤256 tokens) in {:.1} s = {:.0} passages/s",
        passages.len(),
        t.elapsed().as_secs_f64(),
        passages.len() as f64 / t.elapsed().as_secs_f64()
    );
}

/// Corpus entries (id, title, text) as documents to ingest.
fn as_docs(corpus: &[(String, String, String)]) -> Vec<IngestDoc> {
    corpus
        .iter()
        .map(|(id, title, text)| IngestDoc {
            id: id.clone(),
            title: title.clone(),
            text: text.clone(),
            metadata: serde_json::Map::new(),
            sections: Vec::new(),
        })
        .collect()
}

/// The corpus and the embedding service behind it.
pub struct Rag {
    pub corpus: Corpus,
    pub svc: Arc<EmbedService>,
}

/// A search through the pipeline's search step (no reranking).
pub async fn search(
    budget: &RequestBudget,
    svc: &Arc<EmbedService>,
    index: &Arc<CollectionIndex>,
    req: &SearchRequest,
) -> SearchOutcome {
    let retriever = IndexRetriever(index.clone(), lexical_unit());
    let deps = SearchDeps {
        embedder: svc.as_ref(),
        retriever: &retriever,
        reranker: None,
    };
    search::run(budget, &deps, req).await
}

/// `BENCH_LEXICAL=chunks|documents` picks what BM25 ranks documents by
/// (default: `auto`, as the service).
fn lexical_unit() -> ragtime_retrieve::LexicalUnit {
    match std::env::var("BENCH_LEXICAL").as_deref() {
        Ok("chunks") => ragtime_retrieve::LexicalUnit::Chunks,
        Ok("documents") => ragtime_retrieve::LexicalUnit::Documents,
        _ => ragtime_retrieve::LexicalUnit::Auto,
    }
}

/// A fresh engine on a temporary SQLite store.
async fn new_rag() -> (Rag, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = std::env::var_os("BENCH_STORE")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().to_owned());
    std::fs::create_dir_all(&path).expect("BENCH_STORE");
    // `BENCH_ENGINE=postgres` searches inside the PostgreSQL (with
    // pgvector) at `BENCH_DATABASE_URL`.
    let postgres = std::env::var("BENCH_ENGINE").is_ok_and(|e| e == "postgres");
    let url = if postgres {
        std::env::var("BENCH_DATABASE_URL").expect("BENCH_ENGINE=postgres needs BENCH_DATABASE_URL")
    } else {
        Store::sqlite_url(&path)
    };
    let store = Store::open(&url).await.expect("store");
    let threads = env_usize("BENCH_THREADS", 2);
    let workers = env_usize("BENCH_WORKERS", 1);
    let (max_tokens, overlap) = (
        env_usize("BENCH_CHUNK", 128),
        env_usize("BENCH_OVERLAP", 24),
    );
    let model = load_model(threads);
    let chunker = model.chunker(max_tokens, overlap);
    let svc = Arc::new(EmbedService::new(
        model,
        ServiceOptions {
            workers,
            ..ServiceOptions::default()
        },
    ));
    let mut corpus = Corpus::new(
        store,
        svc.clone(),
        chunker,
        ChunkParams {
            max_tokens,
            overlap,
        },
    );
    if postgres {
        let ef = env_usize(
            "BENCH_EF_SEARCH",
            ragtime_pipeline::corpus::DEFAULT_EF_SEARCH,
        );
        corpus = corpus
            .with_database_engine(ef)
            .await
            .expect("the database engine");
    }
    (Rag { corpus, svc }, dir)
}

async fn ingest_scifact(data: &SciFact) -> (Rag, tempfile::TempDir) {
    let (rag, dir) = new_rag().await;
    // With the database engine the marker stands for the database at
    // `BENCH_DATABASE_URL` (use the same one again).
    let marker = if rag.corpus.engine().as_resident().is_some() {
        "scifact.ingested"
    } else {
        "scifact.postgres.ingested"
    };
    let kept = std::env::var_os("BENCH_STORE").map(|d| PathBuf::from(d).join(marker));
    if let Some(marker) = kept.as_ref().filter(|m| m.exists()) {
        println!(
            "\n## ingest: reusing the store at {}",
            marker.with_file_name("").display()
        );
        return (rag, dir);
    }
    let threads = env_usize("BENCH_THREADS", 2);
    let workers = env_usize("BENCH_WORKERS", 1);
    let (max_tokens, overlap) = (
        env_usize("BENCH_CHUNK", 128),
        env_usize("BENCH_OVERLAP", 24),
    );
    let t0 = Instant::now();
    let mut chunks = 0usize;
    // `BENCH_DOCS` ingests only the first documents (for quick comparisons).
    let docs = &data.corpus[..env_usize("BENCH_DOCS", data.corpus.len()).min(data.corpus.len())];
    rag.corpus
        .ingest_batches("scifact", docs.chunks(64).map(as_docs), |r| {
            chunks += r.iter().map(|r| r.chunks).sum::<usize>();
        })
        .await
        .expect("ingest");
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "\n## ingest (SciFact corpus, {}, chunk {max_tokens} tokens / overlap {overlap}, {workers} worker(s) x {threads} thread(s), passages {})",
        if rag.corpus.engine().as_resident().is_some() {
            "SQLite, in-memory engine"
        } else {
            "PostgreSQL, database engine"
        },
        if rag.svc.model().passage_int8() {
            "int8 compute"
        } else {
            "fp32 compute"
        }
    );
    println!(
        "documents {}  chunks {}  time {:.1} s  throughput {:.0} chunks/s ({:.0} docs/s)",
        docs.len(),
        chunks,
        secs,
        chunks as f64 / secs,
        docs.len() as f64 / secs
    );
    keep_bm25_fresh(&rag.corpus.store).await;
    if let Some(marker) = kept {
        std::fs::write(marker, docs.len().to_string()).expect("marker");
    }
    (rag, dir)
}

/// What the service's upkeep does after writes (the `postgres` engine
/// with `pg_textsearch`): builds the BM25 index again once a tenth of
/// the documents were written since its last build. `BENCH_BM25_UPKEEP=0`
/// leaves the index as the writes left it.
pub async fn keep_bm25_fresh(store: &Store) {
    if std::env::var("BENCH_BM25_UPKEEP").is_ok_and(|v| v == "0") {
        return;
    }
    let t = std::time::Instant::now();
    match store.keep_bm25_fresh(0.1, 1000).await.expect("BM25 upkeep") {
        Some(look) if look.rebuilt => println!(
            "BM25 index built again ({} of {} documents written since its last build) in {:.1} s",
            look.written_since,
            look.documents,
            t.elapsed().as_secs_f64()
        ),
        Some(look) => println!(
            "BM25 index kept ({} of {} documents written since its last build)",
            look.written_since, look.documents
        ),
        None => {}
    }
}

/// The top 100 chunks for `text` under the generous bench budget.
/// The best `k` chunks for `text` (search at the benchmark's budgets).
/// A search of the SciFact collection with whichever engine the corpus
/// has (a retriever per query, as the service makes one per request).
async fn top_chunks(rag: &Rag, text: &str, mode: Mode, k: usize) -> SearchOutcome {
    let budget = RequestBudget::start(&bench_profile(), &SEARCH_PLAN, None);
    let (retriever, _) = rag.corpus.retriever("scifact").await.expect("collection");
    let deps = SearchDeps {
        embedder: rag.svc.as_ref(),
        retriever: retriever.as_ref(),
        reranker: None,
    };
    let req = SearchRequest {
        query: text.to_owned(),
        top_k: k,
        mode,
        filter: Filter::All,
    };
    search::run(&budget, &deps, &req).await
}

/// Passages a quality search asks for: 30 hold 10 distinct documents at
/// least (3 passages a document at most), and the retrievers are asked
/// for what a top 10 asks them for (`candidates`: 100 each). A deeper
/// search would measure another ranking than the one a user gets where
/// an engine's walk depends on its depth (pg_textsearch's does).
const NDCG_PASSAGES: usize = 30;

/// Distinct documents in rank order (a document ranks where its best chunk
/// does).
fn documents(out: &SearchOutcome, n: usize) -> Vec<&str> {
    let mut seen = HashSet::new();
    out.hits
        .iter()
        .map(|h| h.chunk.external_id.as_str())
        .filter(|d| seen.insert(*d))
        .take(n)
        .collect()
}

async fn scifact_quality(rag: &Rag, data: &SciFact) {
    println!(
        "\n## retrieval quality: BEIR SciFact train queries ({} queries), documents, {} engine",
        data.queries.len(),
        if rag.corpus.engine().as_resident().is_some() {
            "memory"
        } else {
            "postgres"
        }
    );
    println!(
        "(recall@100: relevant documents among the first 100 retrieved; none found: queries with no relevant document in those 100)"
    );
    println!(
        "(nDCG@10 from a search of {NDCG_PASSAGES} passages: as deep as a top 10's; even / odd: the even- and odd-numbered queries, one half to choose on, the other to read)"
    );
    println!("| mode | nDCG@10 | even | odd | recall@100 | none found | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    assert_eq!(
        search::candidates(NDCG_PASSAGES, &search::FUSION),
        search::candidates(10, &search::FUSION)
    );
    for (name, mode) in [
        ("lexical (BM25, whole documents)", Mode::Lexical),
        ("dense (MiniLM)", Mode::Dense),
        ("hybrid (fused documents)", Mode::Hybrid),
    ] {
        let mut halves = [0.0, 0.0];
        let mut recall = 0.0;
        let mut none = 0usize;
        let mut times = Vec::with_capacity(data.queries.len());
        for (i, (qid, text)) in data.queries.iter().enumerate() {
            let relevant = data.qrels.get(qid).cloned().unwrap_or_default();
            let t = Instant::now();
            let out = top_chunks(rag, text, mode, NDCG_PASSAGES).await;
            times.push(t.elapsed());
            halves[i % 2] += ndcg_at_10(&documents(&out, 10), &relevant);
            // Deeper, untimed: enough chunks for 100 distinct documents.
            let deep = top_chunks(rag, text, mode, 400).await;
            let found = documents(&deep, 100)
                .iter()
                .filter(|d| relevant.contains(**d))
                .count();
            if !relevant.is_empty() {
                recall += found as f64 / relevant.len() as f64;
            }
            none += usize::from(found == 0);
        }
        let n = data.queries.len() as f64;
        let even = data.queries.len().div_ceil(2) as f64;
        println!(
            "| {name} | {:.4} | {:.4} | {:.4} | {:.4} | {:.1} % | {:.2} | {:.2} |",
            (halves[0] + halves[1]) / n,
            halves[0] / even,
            halves[1] / (n - even),
            recall / n,
            none as f64 * 100.0 / n,
            pct(&mut times, 50.0),
            pct(&mut times, 99.0)
        );
    }
    println!("(published BEIR test-split figures: BM25 0.665, all-MiniLM-L6-v2 0.645)");
}

async fn vectors(rag: &Rag, data: &SciFact) {
    let svc = &rag.svc;
    println!("\n## embedding (all-MiniLM-L6-v2 int8, ONNX Runtime, 2 intra-op threads)");
    let mut times = query_times(svc, data).await;
    println!(
        "query embedding (uncached, {} queries): p50 {:.2} ms  p99 {:.2} ms",
        times.len(),
        pct(&mut times, 50.0),
        pct(&mut times, 99.0)
    );
    let mut cached = Vec::new();
    for (_, q) in data.queries.iter().take(300) {
        svc.embed_query(q, Cancel::new()).await.expect("warm");
        let t = Instant::now();
        svc.embed_query(q, Cancel::new()).await.expect("cached");
        cached.push(t.elapsed());
    }
    println!(
        "query embedding (cache hit): p50 {:.3} ms  p99 {:.3} ms",
        pct(&mut cached, 50.0),
        pct(&mut cached, 99.0)
    );
    let passages: Vec<String> = data
        .corpus
        .iter()
        .take(32 * 10)
        .map(|(_, t, x)| format!("{t}\n{x}"))
        .collect();
    for int8 in [false, true] {
        let mut batch = Vec::new();
        for b in passages.chunks(32) {
            let t = Instant::now();
            if int8 {
                svc.embed_passages(b.to_vec(), Cancel::new()).await
            } else {
                svc.embed(b.to_vec(), Cancel::new()).await
            }
            .expect("embed");
            batch.push(t.elapsed());
        }
        println!(
            "batch of 32 passages (SciFact abstracts, ≤256 tokens, {}): p50 {:.0} ms  ({:.1} ms/passage)",
            if int8 && svc.model().passage_int8() {
                "int8 compute"
            } else {
                "fp32 compute"
            },
            pct(&mut batch, 50.0),
            pct(&mut batch, 50.0) / 32.0
        );
    }

    // 100k vectors: SciFact chunk embeddings plus perturbed copies.
    let index = rag.corpus.collection("scifact").await.expect("collection");
    let base: Vec<Arc<Chunk>> = (1..=200_000i64).filter_map(|id| index.chunk(id)).collect();
    let model_vecs: HashMap<i64, Vec<f32>> = rag
        .corpus
        .store
        .index_chunks()
        .await
        .expect("chunks")
        .into_iter()
        .map(|c| (c.chunk_id, c.embedding))
        .collect();
    let n = env_usize("BENCH_VECTORS", 100_000);
    let mut rng = Rng(42);
    let mut vecs = Vec::with_capacity(n);
    let mut items = Vec::with_capacity(n);
    for i in 0..n {
        let src = &base[i % base.len()];
        let mut v = model_vecs[&src.chunk_id].clone();
        if i >= base.len() {
            v.iter_mut().for_each(|x| *x += 0.02 * rng.gauss());
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x /= norm);
        }
        let id = i as i64 + 1;
        let e = Chunk {
            chunk_id: id,
            document_id: id,
            external_id: format!("{}#{i}", src.external_id),
            position: 0,
            title: src.title.clone(),
            section: String::new(),
            metadata: Arc::new(serde_json::json!({"bucket": id % 1000})),
            text: src.text.clone(),
        };
        vecs.push(v.clone());
        items.push((e, v));
    }
    // Queries 0..200 choose (the quantization's range was chosen on
    // them), 200..400 are unseen.
    let all_queries: Vec<Vec<f32>> = svc
        .embed(
            data.queries
                .iter()
                .take(400)
                .map(|(_, q)| q.clone())
                .collect(),
            Cancel::new(),
        )
        .await
        .expect("queries");
    let (queries, unseen) = all_queries.split_at(200);
    quantization(&vecs, queries, unseen);
    let anon = || scaling::proc_status(std::process::id(), "RssAnon:") as f64 / 1024.0;
    let before = anon();
    // As the server keeps it: the BM25 indexes on disk, memory-mapped.
    let work = tempfile::tempdir().expect("tempdir");
    let workspace = ragtime_retrieve::Workspace::new(work.path()).expect("workspace");
    // BENCH_M and BENCH_EF_CONSTRUCTION build another graph than the
    // shipped one, to choose them by measured recall.
    let p = DenseParams {
        m: env_usize("BENCH_M", DenseParams::default().m),
        ef_construction: env_usize(
            "BENCH_EF_CONSTRUCTION",
            DenseParams::default().ef_construction,
        ),
        ..DenseParams::default()
    };
    let big = Arc::new(CollectionIndex::new_in(384, p, workspace.folder().ok()).expect("index"));
    let t0 = Instant::now();
    for part in items.chunks(10_000) {
        big.add(part.to_vec()).expect("add");
    }
    drop(items);
    println!(
        "\n## vector search at {n} vectors (HNSW M={}, ef_construction={}, ef_search={} here ({} up to {} points, growing as the size's power {}), int8 walk, full-precision rescoring)\nbuild: {:.0} s; the index's own estimate {:.0} MiB resident, {:.0} MiB in mapped files (BM25); RssAnon {:.0} MiB over the process before it",
        p.m,
        p.ef_construction,
        p.ef_for(n),
        p.ef_search,
        p.ef_reference,
        p.ef_growth,
        t0.elapsed().as_secs_f64(),
        big.memory_bytes() as f64 / (1 << 20) as f64,
        big.mapped_bytes() as f64 / (1 << 20) as f64,
        anon() - before
    );
    println!(
        "| filter selectivity | path | p50 ms | p99 ms | QPS (1 thread) | recall@10 (chosen on) | recall@10 (unseen) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (limit, label) in [
        (1000i64, "100 % (no filter)"),
        (500, "50 %"),
        (200, "20 %"),
        (100, "10 %"),
        (10, "1 %"),
        (1, "0.1 %"),
    ] {
        let filter = if limit == 1000 {
            Filter::All
        } else {
            Filter::parse(&serde_json::json!({"bucket": {"$lt": limit}}), "filter").expect("filter")
        };
        let allowed = big.allowed(&filter);
        let mut times = Vec::new();
        let mut found = [0usize; 2];
        let mut path = String::new();
        for (set, qs) in [queries, unseen].into_iter().enumerate() {
            for q in qs {
                let t = Instant::now();
                let (hits, p) = big.dense_search(q, 10, &allowed, &Cancel::new());
                times.push(t.elapsed());
                path = format!("{p:?}");
                let got: HashSet<i64> = hits.iter().map(|h| h.chunk_id).collect();
                let mut exact: Vec<(f32, i64)> = vecs
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| limit == 1000 || (*i as i64 + 1) % 1000 < limit)
                    .map(|(i, v)| (v.iter().zip(q).map(|(a, b)| a * b).sum(), i as i64 + 1))
                    .collect();
                exact.sort_by(|a, b| b.0.total_cmp(&a.0));
                found[set] += exact
                    .iter()
                    .take(10)
                    .filter(|(_, id)| got.contains(id))
                    .count();
            }
        }
        let search_only: f64 = times.iter().map(Duration::as_secs_f64).sum();
        println!(
            "| {label} | {path} | {:.2} | {:.2} | {:.0} | {:.3} | {:.3} |",
            pct(&mut times, 50.0),
            pct(&mut times, 99.0),
            times.len() as f64 / search_only,
            found[0] as f64 / (queries.len() * 10) as f64,
            found[1] as f64 / (unseen.len() * 10) as f64
        );
    }
    // The candidate list swept on the same graph (unfiltered): how much of
    // the lost recall a wider walk wins back, and what it costs.
    println!(
        "\n| ef_search (unfiltered) | p50 ms | p99 ms | recall@10 (chosen on) | recall@10 (unseen) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let truth: Vec<HashSet<i64>> = all_queries
        .iter()
        .map(|q| {
            let mut exact: Vec<(f32, i64)> = vecs
                .iter()
                .enumerate()
                .map(|(i, v)| (v.iter().zip(q).map(|(a, b)| a * b).sum(), i as i64 + 1))
                .collect();
            exact.select_nth_unstable_by(10, |a, b| b.0.total_cmp(&a.0));
            exact[..10].iter().map(|(_, id)| *id).collect()
        })
        .collect();
    let sweep = std::env::var("BENCH_EF_SEARCHES")
        .unwrap_or_else(|_| "160,320,640,1280,1920,2560,3840".into());
    for ef in sweep
        .split(',')
        .filter_map(|e| e.trim().parse::<usize>().ok())
    {
        big.set_ef_search(Some(ef));
        let mut times = Vec::new();
        let mut found = [0usize; 2];
        for (i, (q, truth)) in all_queries.iter().zip(&truth).enumerate() {
            let t = Instant::now();
            let (hits, _) = big.dense_search(q, 10, &Allowed::All, &Cancel::new());
            times.push(t.elapsed());
            found[i / 200] += hits.iter().filter(|h| truth.contains(&h.chunk_id)).count();
        }
        println!(
            "| {ef} | {:.2} | {:.2} | {:.3} | {:.3} |",
            pct(&mut times, 50.0),
            pct(&mut times, 99.0),
            found[0] as f64 / 2000.0,
            found[1] as f64 / 2000.0
        );
    }
    big.set_ef_search(None);
    for (_, q) in data.queries.iter().take(400) {
        svc.embed_query(q, Cancel::new()).await.expect("warm cache");
    }
    let mut times = hybrid_times(svc, &big, data.queries.iter().take(200)).await;
    // Four clients at once, each through its own share of 400 queries.
    let t4 = Instant::now();
    let shares: Vec<Vec<(String, String)>> = (0..4)
        .map(|c| {
            data.queries
                .iter()
                .take(400)
                .skip(c)
                .step_by(4)
                .cloned()
                .collect()
        })
        .collect();
    let clients = shares.into_iter().map(|share| {
        let (svc, big) = (svc.clone(), big.clone());
        tokio::spawn(async move { hybrid_times(&svc, &big, share.iter()).await })
    });
    let mut four = Vec::new();
    for c in futures::future::join_all(clients).await {
        four.extend(c.expect("client"));
    }
    let rate = four.len() as f64 / t4.elapsed().as_secs_f64();
    // A fresh service, so no query is in its cache.
    let fresh = Arc::new(EmbedService::new(
        load_model(env_usize("BENCH_THREADS", 2)),
        ServiceOptions::default(),
    ));
    let mut e2e = hybrid_times(&fresh, &big, data.queries.iter().skip(400).take(200)).await;
    println!(
        "\nhybrid search at {n} chunks (dense + BM25 + RRF, query vector cached): p50 {:.2} ms  p99 {:.2} ms",
        pct(&mut times, 50.0),
        pct(&mut times, 99.0)
    );
    println!(
        "hybrid search at {n} chunks including query embedding (uncached): p50 {:.2} ms  p99 {:.2} ms",
        pct(&mut e2e, 50.0),
        pct(&mut e2e, 99.0)
    );
    println!(
        "hybrid search at {n} chunks, 4 concurrent clients (query vector cached): p50 {:.2} ms  p99 {:.2} ms  ({rate:.0} searches/s)",
        pct(&mut four, 50.0),
        pct(&mut four, 99.0)
    );
}

/// How the int8 range (`CLIP_SIGMAS`) was chosen: for each range, the
/// share of components it saturates and the recall@10 of an exact int8 scan
/// whose best `ef_search` are rescored at full precision — the most the
/// graph's walk over int8 vectors can find — on both query sets.
fn quantization(vecs: &[Vec<f32>], chosen: &[Vec<f32>], unseen: &[Vec<f32>]) {
    let ef = DenseParams::default().ef_search;
    println!(
        "\n## int8 range (shipped: {} sigmas)",
        ragtime_retrieve::CLIP_SIGMAS
    );
    println!(
        "| range (sigmas) | components saturated | int8 scan + rescore recall@10 (chosen on) | (unseen) |"
    );
    println!("|---:|---:|---:|---:|");
    let dot = |i: usize, q: &[f32]| vecs[i].iter().zip(q).map(|(a, b)| a * b).sum::<f32>();
    // Each query's exact top 10, found once for every range.
    let truth = |qs: &[Vec<f32>]| -> Vec<HashSet<usize>> {
        qs.iter()
            .take(100)
            .map(|q| {
                let mut exact: Vec<(f32, usize)> =
                    (0..vecs.len()).map(|i| (dot(i, q), i)).collect();
                exact.select_nth_unstable_by(10, |a, b| b.0.total_cmp(&a.0));
                exact[..10].iter().map(|(_, i)| *i).collect()
            })
            .collect()
    };
    let (chosen_truth, unseen_truth) = (truth(chosen), truth(unseen));
    let recall = |sigmas: f32, points: &[Vec<i8>], qs: &[Vec<f32>], truth: &[HashSet<usize>]| {
        let mut found = 0usize;
        for (q, truth) in qs.iter().zip(truth) {
            let qq = ragtime_retrieve::quantize_at(q, sigmas);
            let mut approx: Vec<(i32, usize)> = points
                .iter()
                .enumerate()
                .map(|(i, p)| (ragtime_retrieve::dot_i8(&qq, p), i))
                .collect();
            approx.select_nth_unstable_by(ef, |a, b| b.0.cmp(&a.0));
            let mut rescored: Vec<(f32, usize)> =
                approx[..ef].iter().map(|(_, i)| (dot(*i, q), *i)).collect();
            rescored.sort_by(|a, b| b.0.total_cmp(&a.0));
            found += rescored[..10]
                .iter()
                .filter(|(_, i)| truth.contains(i))
                .count();
        }
        found as f64 / (truth.len() * 10) as f64
    };
    for sigmas in [3.0f32, 4.0, 5.0, 6.0, 8.0, 12.0] {
        let points: Vec<Vec<i8>> = vecs
            .iter()
            .map(|v| ragtime_retrieve::quantize_at(v, sigmas))
            .collect();
        let saturated = points.iter().flatten().filter(|x| x.abs() == 127).count();
        println!(
            "| {sigmas} | {:.4} % | {:.3} | {:.3} |",
            100.0 * saturated as f64 / (points.len() * 384) as f64,
            recall(sigmas, &points, chosen, &chosen_truth),
            recall(sigmas, &points, unseen, &unseen_truth)
        );
    }
}

/// Hybrid search latency (top 10, no filter) for each query.
async fn hybrid_times<'a>(
    svc: &Arc<EmbedService>,
    index: &Arc<CollectionIndex>,
    queries: impl Iterator<Item = &'a (String, String)>,
) -> Vec<Duration> {
    let mut times = Vec::new();
    for (_, q) in queries {
        let budget = RequestBudget::start(&bench_profile(), &SEARCH_PLAN, None);
        let t = Instant::now();
        let req = SearchRequest {
            query: q.clone(),
            top_k: 10,
            mode: Mode::Hybrid,
            filter: Filter::All,
        };
        let out = search(&budget, svc, index, &req).await;
        times.push(t.elapsed());
        assert!(!out.hits.is_empty(), "hybrid search found nothing");
    }
    times
}

/// Uncached embedding latency of the first 300 SciFact queries, one by one.
async fn query_times(svc: &EmbedService, data: &SciFact) -> Vec<Duration> {
    let mut times = Vec::new();
    for (_, q) in data.queries.iter().take(300) {
        let t = Instant::now();
        svc.embed(vec![q.clone()], Cancel::new())
            .await
            .expect("embed");
        times.push(t.elapsed());
    }
    times
}
