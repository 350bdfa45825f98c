//! `ragtime-bench rerank`: the shared cross-encoder (`../shared/models/
//! ce-minilm-l6`, or `RAGTIME_RERANK_DIR`) on SciFact — nDCG@10 of hybrid
//! search on the train queries with and without reranking, for blend
//! weights 0 (retrieval order) to 1 (cross-encoder order), and rerank
//! latency for 10, 20 and 50 candidates, fp32 and int8.

use crate::Rag;
use crate::data::SciFact;
use crate::stats::{ndcg_at_10, pct};
use crate::{cache, env_usize, top_chunks};
use ragtime_core::Cancel;
use ragtime_core::Passage as SearchHit;
use ragtime_pipeline::rerank::{blend, passage};
use ragtime_pipeline::search::Mode;
use ragtime_rerank::{CrossEncoder, RerankOptions};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

fn model_dir() -> PathBuf {
    std::env::var_os("RAGTIME_RERANK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/ce-minilm-l6")
        })
}

pub fn load(file: &str) -> CrossEncoder {
    CrossEncoder::load(&RerankOptions {
        model_dir: model_dir(),
        model_file: file.to_owned(),
        ort_lib: cache().join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: env_usize("BENCH_THREADS", 2),
        max_tokens: 256,
    })
    .unwrap_or_else(|e| panic!("cross-encoder (set RAGTIME_RERANK_DIR): {e}"))
}

fn ndcg(hits: &[SearchHit], relevant: &HashSet<String>) -> f64 {
    let mut seen = HashSet::new();
    let ranked: Vec<&str> = hits
        .iter()
        .map(|h| h.chunk.external_id.as_str())
        .filter(|d| seen.insert(*d))
        .take(10)
        .collect();
    ndcg_at_10(&ranked, relevant)
}

pub async fn rerank(rag: &Rag, data: &SciFact) {
    let index = rag.corpus.collection("scifact").await.expect("collection");
    let depth = env_usize("BENCH_RERANK_DEPTH", 20);
    let batch = env_usize("BENCH_RERANK_BATCH", 4);
    // Hybrid candidates for every train query.
    let mut lists = Vec::with_capacity(data.queries.len());
    for (qid, text) in &data.queries {
        let out = top_chunks(rag, &index, text, Mode::Hybrid, 100).await;
        lists.push((qid.clone(), text.clone(), out.hits));
    }
    let none = HashSet::new();
    let rel = |qid: &str| data.qrels.get(qid).unwrap_or(&none);

    for file in ["model.onnx", "model-int8.onnx"] {
        let ce = load(file);
        // Latency of the rerank stage's work: batches of `batch`, best-first.
        println!("\n## rerank latency ({file}, batches of {batch}, 50 SciFact queries)");
        println!("| candidates | p50 ms | p95 ms |");
        println!("|---:|---:|---:|");
        for n in [10usize, 20, 50] {
            let mut times = Vec::new();
            for (_, q, hits) in lists.iter().take(50) {
                let texts: Vec<String> = hits.iter().take(n).map(passage).collect();
                let t = Instant::now();
                for b in texts.chunks(batch) {
                    ce.score(q, b, &Cancel::new()).expect("score");
                }
                times.push(t.elapsed());
            }
            println!(
                "| {n} | {:.0} | {:.0} |",
                pct(&mut times, 50.0),
                pct(&mut times, 95.0)
            );
        }
        // Scores for the top `depth` of every query, then every blend weight.
        let t = Instant::now();
        let mut scores = Vec::with_capacity(lists.len());
        for (_, q, hits) in &lists {
            let texts: Vec<String> = hits.iter().take(depth).map(passage).collect();
            let mut s = Vec::new();
            for b in texts.chunks(16) {
                s.extend(ce.score(q, b, &Cancel::new()).expect("score"));
            }
            scores.push(s);
        }
        println!(
            "\n## nDCG@10 on {} SciFact train queries, hybrid top {depth} reranked ({file}; scored in {:.0} s)",
            lists.len(),
            t.elapsed().as_secs_f64()
        );
        println!("| cross-encoder weight | nDCG@10 |");
        println!("|---:|---:|");
        for w in [0.0f32, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0] {
            let total: f64 = lists
                .iter()
                .zip(&scores)
                .map(|((qid, _, hits), s)| ndcg(&blend(hits.clone(), s, w), rel(qid)))
                .sum();
            let label = match w {
                0.0 => " (no rerank)".to_owned(),
                1.0 => " (cross-encoder only)".to_owned(),
                _ => String::new(),
            };
            println!("| {w:.1}{label} | {:.4} |", total / lists.len() as f64);
        }
    }
}
