//! `ragtime-bench rerank`: the shared cross-encoder (`../shared/models/
//! ce-minilm-l6`, or `RAGTIME_RERANK_DIR`) on SciFact — nDCG@10 of hybrid
//! search on the train queries with and without reranking — all of them,
//! and apart the 109 the cross-encoder was not trained on — by depth (the
//! documents reranked, each by its best passage) and blend weight (0:
//! retrieval order, 1: cross-encoder order), and rerank latency for 10 to
//! 30 documents, int8 and fp32 (`BENCH_RERANK_MODELS`).

use crate::Rag;
use crate::data::{SciFact, unseen_by_reranker};
use crate::stats::{ndcg_at_10, pct};
use crate::{cache, env_usize, top_chunks};
use ragtime_core::Cancel;
use ragtime_core::Passage as SearchHit;
use ragtime_pipeline::rerank::{blend_documents, documents, passage};
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
    let max_depth = env_usize("BENCH_RERANK_DEPTH", 20);
    let batch = env_usize("BENCH_RERANK_BATCH", 4);
    let unseen = unseen_by_reranker(&data.queries);
    // Hybrid candidates for every train query, as documents (each with
    // its passages; the first is what the cross-encoder reads).
    let mut lists = Vec::with_capacity(data.queries.len());
    for (qid, text) in &data.queries {
        let out = top_chunks(rag, text, Mode::Hybrid, 100).await;
        lists.push((qid.clone(), text.clone(), documents(out.hits)));
    }
    let none = HashSet::new();
    let rel = |qid: &str| data.qrels.get(qid).unwrap_or(&none);
    let files = std::env::var("BENCH_RERANK_MODELS")
        .unwrap_or_else(|_| "model-int8.onnx,model.onnx".into());
    for file in files.split(',') {
        let ce = load(file);
        // Latency of the rerank stage's work: batches of `batch`, best-first.
        println!(
            "\n## rerank latency ({file}, batches of {batch}, 50 SciFact queries, a document's best passage each)"
        );
        println!("| documents | p50 ms | p95 ms |");
        println!("|---:|---:|---:|");
        for n in [10usize, 15, 20, 30] {
            let mut times = Vec::new();
            for (_, q, groups) in lists.iter().take(50) {
                let texts: Vec<String> = groups.iter().take(n).map(|g| passage(&g[0])).collect();
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
        if std::env::var("BENCH_RERANK_QUALITY").is_ok_and(|v| v == "0") {
            continue;
        }
        // Scores for the top `max_depth` documents of every query, then
        // every depth and blend weight.
        let t = Instant::now();
        let mut scores = Vec::with_capacity(lists.len());
        for (_, q, groups) in &lists {
            let texts: Vec<String> = groups
                .iter()
                .take(max_depth)
                .map(|g| passage(&g[0]))
                .collect();
            let mut s = Vec::new();
            for b in texts.chunks(16) {
                s.extend(ce.score(q, b, &Cancel::new()).expect("score"));
            }
            scores.push(s);
        }
        println!(
            "\n## nDCG@10, hybrid documents reranked ({file}; {} train queries, {} of them unseen by the cross-encoder; scored in {:.0} s)",
            lists.len(),
            unseen.len(),
            t.elapsed().as_secs_f64()
        );
        println!("| depth (documents) | cross-encoder weight | all | unseen | seen |");
        println!("|---:|---:|---:|---:|---:|");
        for depth in [5usize, 10, 15, 20, 30] {
            if depth > max_depth {
                continue;
            }
            for w in [0.0f32, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0] {
                if depth != 10 && w == 0.0 {
                    continue;
                }
                let (mut all, mut un, mut seen) = (0.0, 0.0, 0.0);
                for ((qid, _, groups), s) in lists.iter().zip(&scores) {
                    let d = depth.min(s.len());
                    let n = ndcg(&blend_documents(groups.clone(), &s[..d], w), rel(qid));
                    all += n;
                    if unseen.contains(qid) {
                        un += n;
                    } else {
                        seen += n;
                    }
                }
                let label = match w {
                    0.0 => " (no rerank)".to_owned(),
                    1.0 => " (cross-encoder only)".to_owned(),
                    _ => String::new(),
                };
                let nu = unseen.len() as f64;
                println!(
                    "| {depth} | {w:.1}{label} | {:.4} | {:.4} | {:.4} |",
                    all / lists.len() as f64,
                    un / nu,
                    seen / (lists.len() as f64 - nu)
                );
            }
        }
    }
}
