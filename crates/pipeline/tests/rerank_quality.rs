//! Reranking with the shared cross-encoder (`../shared/models/ce-minilm-l6`)
//! and the default blend weight does not lower nDCG@10 on the SciFact train
//! queries. Candidates are BM25's top 20 over whole documents (tantivy,
//! through the real collection index); the blend is the pipeline's own.
//! Every 4th train query (202 of 809, about 4,000 pairs: a minute or two on
//! two cores) keeps the test suite fast; `ragtime-bench rerank` measures
//! all of them on hybrid candidates.
//!
//! Runs when `RAGTIME_TEST_RERANK_DIR` is set and `../shared/data/scifact`
//! exists (`make test` and CI); otherwise it says it did not run.

use ragtime_testkit::scifact as data;

use ragtime_core::Passage as SearchHit;
use ragtime_core::{Cancel, Filter};
use ragtime_pipeline::rerank::{DEFAULT_WEIGHT, blend, passage};
use ragtime_rerank::{CrossEncoder, RerankOptions};
use ragtime_retrieve::{Chunk, CollectionIndex, DenseParams};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

const DEPTH: usize = 20;
const STEP: usize = 4;

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

fn ndcg_at_10(hits: &[SearchHit], relevant: &HashSet<String>) -> f64 {
    let mut seen = HashSet::new();
    let dcg: f64 = hits
        .iter()
        .map(|h| h.chunk.external_id.as_str())
        .filter(|d| seen.insert(*d))
        .take(10)
        .enumerate()
        .filter(|(_, d)| relevant.contains(*d))
        .map(|(i, _)| 1.0 / ((i + 2) as f64).log2())
        .sum();
    let ideal: f64 = (0..relevant.len().min(10))
        .map(|i| 1.0 / ((i + 2) as f64).log2())
        .sum();
    if ideal > 0.0 { dcg / ideal } else { 0.0 }
}

#[test]
#[ignore = "needs ../shared (the cross-encoder and SciFact)"]
fn needs_shared_reranking_does_not_lower_ndcg_on_scifact_train() {
    let dir = PathBuf::from(ragtime_testkit::need(
        "RAGTIME_TEST_RERANK_DIR",
        "the shared cross-encoder (../shared/models/ce-minilm-l6)",
    ));
    ragtime_testkit::need("RAGTIME_SCIFACT", "SciFact (../shared/data/scifact)");
    let data = data::load_scifact();
    let ce = CrossEncoder::load(&RerankOptions {
        model_dir: dir,
        model_file: "model.onnx".into(),
        ort_lib: cache().join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: 2,
        max_tokens: 256,
    })
    .expect("load the shared cross-encoder");

    // Whole documents in a real collection index; the dense side is not
    // used here, so its vectors are placeholders.
    let index = CollectionIndex::new(2, DenseParams::default()).expect("index");
    let items = data
        .corpus
        .iter()
        .enumerate()
        .map(|(i, (id, title, text))| {
            let n = i as i64 + 1;
            let angle = n as f32;
            (
                Chunk {
                    chunk_id: n,
                    document_id: n,
                    external_id: id.clone(),
                    position: 0,
                    title: title.clone(),
                    section: String::new(),
                    metadata: Arc::new(serde_json::json!({})),
                    text: text.clone(),
                },
                vec![angle.cos(), angle.sin()],
            )
        })
        .collect();
    index.add(items).expect("add");
    let allowed = index.allowed(&Filter::All);

    let (mut before, mut after, mut n) = (0.0, 0.0, 0usize);
    let none = HashSet::new();
    for (qid, query) in data.queries.iter().step_by(STEP) {
        let hits: Vec<SearchHit> = index
            .lexical_search(query, DEPTH, &allowed, &Cancel::new())
            .expect("bm25")
            .into_iter()
            .filter_map(|h| {
                index.chunk(h.chunk_id).map(|chunk| SearchHit {
                    chunk,
                    score: h.score,
                })
            })
            .collect();
        let texts: Vec<String> = hits.iter().map(passage).collect();
        let scores = ce.score(query, &texts, &Cancel::new()).expect("score");
        let relevant = data.qrels.get(qid).unwrap_or(&none);
        before += ndcg_at_10(&hits, relevant);
        after += ndcg_at_10(&blend(hits, &scores, DEFAULT_WEIGHT), relevant);
        n += 1;
    }
    let (before, after) = (before / n as f64, after / n as f64);
    eprintln!(
        "SciFact train, {n} queries, BM25 top {DEPTH}: nDCG@10 {before:.4} without reranking, {after:.4} reranked (weight {DEFAULT_WEIGHT})"
    );
    assert_eq!(
        n,
        809usize.div_ceil(STEP),
        "every 4th train query with judgements"
    );
    assert!(
        after >= before,
        "reranking lowered nDCG@10: {before:.4} → {after:.4}"
    );
}
