//! `ragtime-bench fusion`: how retrieval's rankings are chosen, on the
//! SciFact train queries. Each query's rankings are taken once — dense
//! chunks (HNSW), BM25 over chunks, BM25 over whole documents at several
//! title boosts — and then fused offline every way in question: RRF with
//! its k, per-retriever weights and the depth each retriever contributes,
//! and a convex combination of min–max normalised scores. Prints nDCG@10
//! and recall@100 for each; the shipped settings are `search::FUSION` and
//! `Boosts::DOCUMENTS`.

use crate::Rag;
use crate::data::SciFact;
use crate::stats::ndcg_at_10;
use ragtime_core::{Cancel, Filter, Fusion, FusionParams, fuse};
use ragtime_retrieve::{Allowed, Boosts, CollectionIndex};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Deepest list taken from each retriever.
const DEEP: usize = 300;
const TITLE_BOOSTS: [f32; 8] = [0.25, 0.4, 0.5, 0.6, 0.75, 1.0, 1.5, 3.0];

struct Query {
    relevant: HashSet<String>,
    /// Dense chunk hits, best first, as (document, score).
    dense: Vec<(i64, f32)>,
    /// BM25 over chunks, as (document, score).
    chunks: Vec<(i64, f32)>,
    /// BM25 over documents, one list per title boost.
    documents: Vec<Vec<(i64, f32)>>,
}

/// A chunk list's documents by their best chunk, first `depth` chunks.
fn by_document(chunks: &[(i64, f32)], depth: usize) -> Vec<(i64, f32)> {
    let mut seen = HashSet::new();
    chunks
        .iter()
        .take(depth)
        .filter(|(d, _)| seen.insert(*d))
        .copied()
        .collect()
}

struct Score {
    ndcg: f64,
    recall: f64,
}

fn score<'a>(
    qs: impl IntoIterator<Item = &'a Query>,
    names: &HashMap<i64, String>,
    rank: impl Fn(&Query) -> Vec<i64>,
) -> Score {
    let mut n = 0usize;
    let (mut ndcg, mut recall) = (0.0, 0.0);
    for q in qs {
        n += 1;
        let ranked: Vec<&str> = rank(q)
            .iter()
            .filter_map(|d| names.get(d).map(String::as_str))
            .collect();
        ndcg += ndcg_at_10(&ranked, &q.relevant);
        let found = ranked
            .iter()
            .take(100)
            .filter(|d| q.relevant.contains(**d))
            .count();
        recall += found as f64 / q.relevant.len().max(1) as f64;
    }
    let n = n as f64;
    Score {
        ndcg: ndcg / n,
        recall: recall / n,
    }
}

/// A query's documents in fused order: its dense chunks by document and
/// its BM25 document list `list`, each `p.depth` deep.
fn fused(q: &Query, list: usize, p: &FusionParams) -> Vec<i64> {
    let dense = by_document(&q.dense, p.depth);
    let lexical: Vec<(i64, f32)> = q.documents[list].iter().take(p.depth).copied().collect();
    ids(&fuse(&dense, &lexical, p))
}

fn ids(l: &[(i64, f32)]) -> Vec<i64> {
    l.iter().map(|(d, _)| *d).collect()
}

pub async fn fusion(rag: &Rag, data: &SciFact) {
    if rag.corpus.engine().as_resident().is_none() {
        return engine_fusion(rag, data).await;
    }
    let index: Arc<CollectionIndex> = rag.corpus.collection("scifact").await.expect("collection");
    let cancel = Cancel::new();
    let all = index.allowed(&Filter::All);
    let mut names: HashMap<i64, String> = HashMap::new();
    let doc_of = |chunk: i64, names: &mut HashMap<i64, String>| {
        index.chunk(chunk).map(|c| {
            names.insert(c.document_id, c.external_id.clone());
            c.document_id
        })
    };
    let mut qs = Vec::with_capacity(data.queries.len());
    for (qid, text) in &data.queries {
        let (v, _) = rag
            .svc
            .embed_query(text, Cancel::new())
            .await
            .expect("embed");
        let dense: Vec<(i64, f32)> = index
            .dense_search(&v, DEEP, &Allowed::All, &cancel)
            .0
            .iter()
            .filter_map(|h| doc_of(h.chunk_id, &mut names).map(|d| (d, h.score)))
            .collect();
        let chunks: Vec<(i64, f32)> = index
            .lexical_search(text, DEEP, &all, &cancel)
            .expect("bm25")
            .iter()
            .filter_map(|h| doc_of(h.chunk_id, &mut names).map(|d| (d, h.score)))
            .collect();
        let documents = TITLE_BOOSTS
            .iter()
            .map(|&title| {
                let boosts = Boosts {
                    title,
                    ..Boosts::DOCUMENTS
                };
                index
                    .document_search(text, DEEP, &all, boosts, None, 1, &cancel)
                    .expect("bm25")
                    .iter()
                    .map(|d| {
                        if let Some(c) = d.chunks.first() {
                            doc_of(c.chunk_id, &mut names);
                        }
                        (d.document_id, d.score)
                    })
                    .collect()
            })
            .collect();
        qs.push(Query {
            relevant: data.qrels.get(qid).cloned().unwrap_or_default(),
            dense,
            chunks,
            documents,
        });
    }

    println!(
        "\n## lexical retrieval ({} SciFact train queries)",
        qs.len()
    );
    println!("| BM25 over | title boost | nDCG@10 | recall@100 |");
    println!("|---|---:|---:|---:|");
    let s = score(&qs, &names, |q| ids(&by_document(&q.chunks, DEEP)));
    println!(
        "| chunks (128 tokens) | 1.0 | {:.4} | {:.4} |",
        s.ndcg, s.recall
    );
    let mut best_boost = (0usize, 0.0f64);
    for (i, b) in TITLE_BOOSTS.iter().enumerate() {
        let s = score(&qs, &names, |q| ids(&q.documents[i]));
        if s.ndcg > best_boost.1 {
            best_boost = (i, s.ndcg);
        }
        println!(
            "| whole documents | {b:.2} | {:.4} | {:.4} |",
            s.ndcg, s.recall
        );
    }
    let s = score(&qs, &names, |q| ids(&by_document(&q.dense, DEEP)));
    println!(
        "| (dense, for reference) | | {:.4} | {:.4} |",
        s.ndcg, s.recall
    );
    let bi = best_boost.0;
    println!(
        "best title boost: {:.2} (shipped: {:.2})",
        TITLE_BOOSTS[bi],
        Boosts::DOCUMENTS.title
    );

    println!(
        "\n## fusion (dense chunks → documents by best chunk, BM25 documents at title boost {:.2})",
        TITLE_BOOSTS[bi]
    );
    println!("| method | k | weights (dense / lexical) | depth | nDCG@10 | recall@100 |");
    println!("|---|---:|---:|---:|---:|---:|");
    let run = |p: &FusionParams, lexical_chunks: bool| {
        score(&qs, &names, |q| {
            if lexical_chunks {
                let dense = by_document(&q.dense, p.depth);
                ids(&fuse(&dense, &by_document(&q.chunks, p.depth), p))
            } else {
                fused(q, bi, p)
            }
        })
    };
    let mut best: (f64, String) = (0.0, String::new());
    let mut row = |label: &str, p: &FusionParams, lexical_chunks: bool| {
        let s = run(p, lexical_chunks);
        let k = match p.method {
            Fusion::Rrf { k } => format!("{k:.0}"),
            Fusion::Convex => "–".into(),
        };
        let line = format!(
            "| {label} | {k} | {:.2} / {:.2} | {} | {:.4} | {:.4} |",
            p.dense_weight, p.lexical_weight, p.depth, s.ndcg, s.recall
        );
        if s.ndcg > best.0 && !lexical_chunks {
            best = (s.ndcg, line.clone());
        }
        println!("{line}");
    };
    row("RRF, BM25 over chunks (before)", &FusionParams::RRF, true);
    for p in grid() {
        let label = match p.method {
            Fusion::Rrf { .. } => "RRF",
            Fusion::Convex => "convex",
        };
        row(label, &p, false);
    }
    println!("best: {}", best.1);
    let shipped = run(&ragtime_pipeline::search::FUSION, false);
    println!(
        "shipped (search::FUSION): nDCG@10 {:.4} recall@100 {:.4}",
        shipped.ndcg, shipped.recall
    );
}

/// The grid of fusions both engines are chosen from.
fn grid() -> Vec<FusionParams> {
    let mut out = Vec::new();
    for depth in [20usize, 50, 100, 200] {
        for k in [5.0f32, 10.0, 20.0, 60.0] {
            for w in [0.75f32, 1.0, 1.25] {
                out.push(FusionParams {
                    method: Fusion::Rrf { k },
                    dense_weight: 1.0,
                    lexical_weight: w,
                    depth,
                });
            }
        }
    }
    for depth in [20usize, 50, 100, 150, 200] {
        for a in [0.4f32, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8] {
            out.push(FusionParams {
                method: Fusion::Convex,
                dense_weight: a,
                lexical_weight: 1.0 - a,
                depth,
            });
        }
    }
    out
}

/// The fusion of an engine other than the in-memory one (`BENCH_ENGINE`),
/// through its retriever as the pipeline calls it. Chosen on the
/// even-numbered train queries; the odd-numbered ones are kept unseen
/// and report the choice against the in-memory engine's fusion.
async fn engine_fusion(rag: &Rag, data: &SciFact) {
    let mut names: HashMap<i64, String> = HashMap::new();
    let mut qs = Vec::with_capacity(data.queries.len());
    for (qid, text) in &data.queries {
        let (retriever, _) = rag.corpus.retriever("scifact").await.expect("collection");
        let (v, _) = rag
            .svc
            .embed_query(text, Cancel::new())
            .await
            .expect("embed");
        let mut doc_of = |chunk: i64| {
            retriever.chunk(chunk).map(|c| {
                names.insert(c.document_id, c.external_id.clone());
                c.document_id
            })
        };
        let dense: Vec<(i64, f32)> = retriever
            .dense(v, DEEP, &Filter::All, Cancel::new())
            .await
            .expect("dense")
            .iter()
            .filter_map(|h| doc_of(h.chunk_id).map(|d| (d, h.score)))
            .collect();
        let documents: Vec<(i64, f32)> = retriever
            .lexical_documents(text, DEEP, &Filter::All, None, 1, Cancel::new())
            .await
            .expect("lexical")
            .iter()
            .map(|d| {
                if let Some(c) = d.chunks.first() {
                    doc_of(c.chunk_id);
                }
                (d.document_id, d.score)
            })
            .collect();
        qs.push(Query {
            relevant: data.qrels.get(qid).cloned().unwrap_or_default(),
            dense,
            chunks: Vec::new(),
            documents: vec![documents],
        });
    }
    let run =
        |qs: &[&Query], p: &FusionParams| score(qs.iter().copied(), &names, |q| fused(q, 0, p));
    let fit: Vec<&Query> = qs.iter().step_by(2).collect();
    let unseen: Vec<&Query> = qs.iter().skip(1).step_by(2).collect();
    let all: Vec<&Query> = qs.iter().collect();
    let label = |p: &FusionParams| match p.method {
        Fusion::Rrf { k } => format!(
            "RRF k {k:.0}, weights {:.2} / {:.2}, depth {}",
            p.dense_weight, p.lexical_weight, p.depth
        ),
        Fusion::Convex => format!(
            "convex, weights {:.2} / {:.2}, depth {}",
            p.dense_weight, p.lexical_weight, p.depth
        ),
    };
    let mut best: Option<(f64, FusionParams)> = None;
    for p in grid() {
        let s = run(&fit, &p).ndcg;
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, p));
        }
    }
    let (_, chosen) = best.expect("a grid");
    println!(
        "\n## fusion through the database engine ({} SciFact train queries: {} to choose on, {} unseen)",
        qs.len(),
        fit.len(),
        unseen.len()
    );
    println!(
        "| fusion | chosen on (nDCG@10) | unseen (nDCG@10) | all (nDCG@10) | all (recall@100) |"
    );
    println!("|---|---:|---:|---:|---:|");
    let memory = ragtime_pipeline::search::FUSION;
    let shipped = ragtime_pipeline::corpus::DATABASE_FUSION;
    for (what, p) in [
        ("the in-memory engine's", &memory),
        ("best of the grid", &chosen),
        ("shipped for the database engine", &shipped),
    ] {
        let a = run(&all, p);
        println!(
            "| {what}: {} | {:.4} | {:.4} | {:.4} | {:.4} |",
            label(p),
            run(&fit, p).ndcg,
            run(&unseen, p).ndcg,
            a.ndcg,
            a.recall
        );
    }
    let s = score(&qs, &names, |q| ids(&q.documents[0]));
    let d = score(&qs, &names, |q| ids(&by_document(&q.dense, DEEP)));
    println!(
        "lexical alone {:.4}, dense alone {:.4} (all queries)",
        s.ndcg, d.ndcg
    );
}
