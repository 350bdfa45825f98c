//! The real all-MiniLM-L6-v2 ONNX model from `make setup`.

use prost::Message;
use ragtime_core::{Cancel, StageError};
use ragtime_embed::{EmbedService, EmbedderOptions, Kind, OnnxEmbedder, ServiceOptions};
use ragtime_onnx::prepare::Outcome;
use ragtime_onnx::proto::ModelProto;
use ragtime_onnx::{Simplified, decode_model};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

fn options(model_dir: &Path) -> EmbedderOptions {
    EmbedderOptions {
        model_dir: model_dir.to_owned(),
        ort_lib: cache().join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: 1,
        max_tokens: 256,
        batch_size: 8,
        max_batch_tokens: 1024,
        passage_int8: true,
    }
}

/// The setup model, from its prepared graphs beside it (written by the
/// first load).
fn load() -> OnnxEmbedder {
    OnnxEmbedder::load(&options(&cache().join("models/all-minilm-l6-v2")))
        .unwrap_or_else(|e| panic!("load the model with `make setup` first: {e}"))
}

fn embedder() -> &'static OnnxEmbedder {
    static E: OnceLock<OnnxEmbedder> = OnceLock::new();
    E.get_or_init(load)
}

fn cos(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn embeddings_are_unit_vectors_that_put_paraphrases_close() {
    let e = embedder();
    assert_eq!(e.dim(), 384);
    let texts: Vec<String> = [
        "How do I bake sourdough bread at home?",
        "What is the way to make sourdough bread in my kitchen?",
        "The stock market fell sharply on Monday.",
    ]
    .map(String::from)
    .to_vec();
    let v = e.embed(&texts, &Cancel::new()).unwrap_or_default();
    assert_eq!(v.len(), 3);
    for x in &v {
        let norm: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    }
    let close = cos(&v[0], &v[1]);
    let far = cos(&v[0], &v[2]);
    assert!(close > 0.7, "paraphrases: {close}");
    assert!(far < 0.3, "unrelated: {far}");
}

#[test]
fn batching_and_padding_do_not_change_a_vector() {
    let e = embedder();
    let short = "a short query".to_owned();
    let long = "a much longer passage about protein folding and the many ways cells keep \
                misfolded proteins from aggregating into toxic clumps"
        .to_owned();
    let alone = e
        .embed(std::slice::from_ref(&short), &Cancel::new())
        .unwrap_or_default();
    let padded = e.embed(&[long, short], &Cancel::new()).unwrap_or_default();
    let c = cos(&alone[0], &padded[1]);
    assert!(c > 0.9999, "padding changed the vector: cosine {c}");
}

/// Texts of mixed length are split into batches by text count and padded
/// tokens (here 8 texts, 1024 tokens): every vector matches the text
/// embedded alone and comes back in the caller's order.
#[test]
fn token_budget_batches_keep_order_and_vectors() {
    let e = embedder();
    let texts: Vec<String> = (0..20)
        .map(|i| {
            let words = 1 + (i * 37) % 120;
            format!(
                "text {i}: {}",
                "cells fold proteins and repair damage ".repeat(words / 6 + 1)
            )
        })
        .collect();
    let together = e.embed(&texts, &Cancel::new()).expect("together");
    assert_eq!(together.len(), texts.len());
    for (t, v) in texts.iter().zip(&together) {
        let alone = e
            .embed(std::slice::from_ref(t), &Cancel::new())
            .expect("alone");
        let c = cos(&alone[0], v);
        assert!(c > 0.9999, "{t:.20}: cosine {c}");
    }
}

#[test]
fn empty_text_is_rejected_and_cancel_stops_the_work() {
    let e = embedder();
    let r = e.embed(&["ok".into(), "  ".into()], &Cancel::new());
    assert_eq!(r, Err(StageError::InvalidInput("text 1 is empty".into())));
    let c = Cancel::new();
    c.cancel();
    assert_eq!(e.embed(&["ok".into()], &c), Err(StageError::Cancelled));
}

const LONG: &str = "Protein misfolding is a hallmark of many neurodegenerative diseases. \
Chaperones such as Hsp70 recognise exposed hydrophobic patches and prevent aggregation. \
When chaperone capacity is exceeded, misfolded proteins are routed to the proteasome. \
Autophagy clears larger aggregates that the proteasome cannot unfold. \
Ageing reduces the capacity of all three systems, which may explain late onset. \
Experimental upregulation of chaperones extends lifespan in worms and flies. \
In mice, the evidence is mixed and depends strongly on the tissue studied. \
Therapeutic strategies therefore target several nodes of the proteostasis network at once.";

#[test]
fn chunks_fit_the_window_overlap_and_cover_the_text() {
    let e = embedder();
    let chunker = e.chunker(40, 10);
    let text = LONG.repeat(3);
    let chunks = chunker.chunk(&text);
    assert!(chunks.len() >= 5, "{} chunks", chunks.len());
    assert_eq!(chunks[0].start, 0);
    assert_eq!(chunks.last().map(|c| c.end), Some(text.trim_end().len()));
    for w in chunks.windows(2) {
        assert!(w[1].start < w[0].end, "consecutive chunks overlap");
        assert!(w[1].start > w[0].start, "chunking moves forward");
    }
    for c in &chunks {
        assert!(c.tokens <= 40, "{} tokens", c.tokens);
        assert_eq!(&text[c.start..c.end], c.text);
        // Never starts or ends inside a word.
        let before = text[..c.start].chars().last();
        assert!(
            before.is_none_or(|ch| !ch.is_alphanumeric()),
            "starts mid-word: {:?}",
            c.text
        );
        let after = text[c.end..].chars().next();
        assert!(
            after.is_none_or(|ch| !ch.is_alphanumeric()),
            "ends mid-word: {:?}",
            c.text
        );
    }
    // Most chunks end at a sentence boundary.
    let at_sentence = chunks.iter().filter(|c| c.text.ends_with('.')).count();
    assert!(
        at_sentence * 2 >= chunks.len(),
        "{at_sentence} of {}",
        chunks.len()
    );
    assert_eq!(chunker.chunk("short text").len(), 1);
    assert!(chunker.chunk("").is_empty());
}

#[test]
fn chunks_end_where_sections_begin() {
    let e = embedder();
    let chunker = e.chunker(40, 10);
    // Three sections: a heading line, then paragraphs (one per line).
    let mut text = String::new();
    let mut starts = Vec::new();
    for h in ["Proteostasis", "Ageing in mice", "Therapies"] {
        starts.push(text.len());
        text.push_str(h);
        text.push('\n');
        for s in LONG.split(". ").take(4) {
            text.push_str(s.trim_end_matches('.'));
            text.push_str(".\n");
        }
    }
    let text = text.trim_end().to_owned();
    let chunks = chunker.chunk_sections(&text, &starts);
    for c in &chunks {
        assert!(c.tokens <= 40, "{} tokens", c.tokens);
        // No chunk runs on past a section start beyond its first quarter.
        for &s in &starts {
            if s > c.start && s < c.end {
                assert!(c.anchor == s, "section at {s} inside {:?}", c.text);
            }
        }
    }
    for &s in &starts {
        assert!(
            chunks.iter().any(|c| c.start == s),
            "a chunk starts at the heading at {s}"
        );
    }
    // Without sections the same text still chunks at line ends.
    let plain = chunker.chunk(&text);
    let at_line = plain[..plain.len() - 1]
        .iter()
        .filter(|c| text[c.end..].starts_with('\n'))
        .count();
    assert!(
        at_line * 2 >= plain.len() - 1,
        "{at_line} of {}",
        plain.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_batches_concurrent_requests_without_changing_results() {
    let svc = std::sync::Arc::new(EmbedService::new(
        load(),
        ServiceOptions {
            max_wait: std::time::Duration::from_millis(5),
            ..ServiceOptions::default()
        },
    ));
    let texts: Vec<String> = (0..12)
        .map(|i| format!("sentence number {i} about cells"))
        .collect();
    let direct = embedder().embed(&texts, &Cancel::new()).unwrap_or_default();
    let handles: Vec<_> = texts
        .iter()
        .cloned()
        .map(|t| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.embed(vec![t], Cancel::new()).await })
        })
        .collect();
    for (h, want) in handles.into_iter().zip(&direct) {
        let got = h.await.expect("join").expect("embed");
        assert!(cos(&got[0], want) > 0.9999);
    }
    assert!(
        svc.runs() < 12,
        "12 concurrent requests took {} model calls: no batching",
        svc.runs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_cache_is_keyed_by_normalised_text_and_cancel_is_honoured() {
    let svc = EmbedService::new(load(), ServiceOptions::default());
    let (a, hit) = svc
        .embed_query("How do  vaccines work?", Cancel::new())
        .await
        .expect("embed");
    assert!(!hit);
    let (b, hit) = svc
        .embed_query("  How do vaccines\twork? ", Cancel::new())
        .await
        .expect("embed");
    assert!(hit, "whitespace differences hit the cache");
    assert_eq!(a, b);
    // NFKC folds full-width letters.
    let (_, hit) = svc
        .embed_query("How do vaccines ｗｏｒｋ?", Cancel::new())
        .await
        .expect("embed");
    assert!(hit);
    assert_eq!(svc.cache_len(), 1);
    let c = Cancel::new();
    c.cancel();
    assert_eq!(
        svc.embed(vec!["x".into()], c).await,
        Err(StageError::Cancelled)
    );
    assert!(svc.embed_query("   ", Cancel::new()).await.is_err());
}

/// The ONNX model (int8 weights) against fp32 reference embeddings computed
/// from the original safetensors by `scripts/reference_embeddings.py`.
#[test]
fn onnx_matches_the_fp32_reference() {
    let (texts, want) = reference();
    assert_eq!(texts.len(), 5);
    let got = embedder().embed(&texts, &Cancel::new()).unwrap_or_default();
    assert_eq!(got.len(), texts.len());
    for ((t, w), v) in texts.iter().zip(&want).zip(&got) {
        let c = cos(v, w);
        eprintln!("cosine {c:.5}  {t}");
        assert!(c >= 0.999, "cosine {c} for {t}");
    }
}

fn reference() -> (Vec<String>, Vec<Vec<f32>>) {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/minilm_reference.json")).expect("fixture");
    fixture["sentences"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let v = s["embedding"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_f64())
                        .map(|x| x as f32)
                        .collect()
                })
                .unwrap_or_default();
            (s["text"].as_str().unwrap_or_default().to_owned(), v)
        })
        .unzip()
}

/// The setup model, decoded.
fn setup_model() -> (Vec<u8>, ModelProto) {
    let bytes = std::fs::read(cache().join("models/all-minilm-l6-v2/model.onnx")).expect("model");
    let model = decode_model(bytes.clone().into()).expect("decode");
    (bytes, model)
}

/// The setup model's 36 dequantize → MatMul products are rewritten to int8
/// compute, and ONNX Runtime runs the rewritten graph.
#[test]
fn the_setup_model_rewrites_to_int8_matrix_products() {
    let (bytes, mut model) = setup_model();
    let rewritten = ragtime_onnx::int8_matmuls(&mut model).expect("rewrite");
    // 6 layers × (query, key, value, attention output, two feed-forward).
    assert_eq!(rewritten, 36);
    assert!(
        model.encode_to_vec().len() < bytes.len(),
        "the dequantize nodes are gone"
    );
    // Idempotent: nothing left to rewrite.
    let before = model.clone();
    assert_eq!(ragtime_onnx::int8_matmuls(&mut model).expect("again"), 0);
    assert_eq!(model, before);
    assert!(embedder().passage_int8());
}

/// The setup model's six attention subgraphs (with their softmax NaN
/// guards) and six erf GELUs are simplified, and a second pass finds
/// nothing left.
#[test]
fn the_setup_model_simplifies_its_attention_and_gelus() {
    let (bytes, mut model) = setup_model();
    let done = ragtime_onnx::simplify(&mut model).expect("simplify");
    assert_eq!(
        done,
        Simplified {
            attentions: 6,
            nan_guards: 0,
            gelus: 6
        }
    );
    let out = model.encode_to_vec();
    assert!(out.len() < bytes.len());
    let none = ragtime_onnx::simplify(&mut model).expect("again");
    assert_eq!(none, Simplified::default());
    assert_eq!(model.encode_to_vec(), out);
    // The int8 rewrite still finds every product in the simplified graph.
    assert_eq!(ragtime_onnx::int8_matmuls(&mut model).expect("int8"), 36);
}

/// Passages (int8 compute) stay close to the fp32 reference; queries keep
/// fp32. The two differ, so the passage path really runs the int8 model.
#[test]
fn passages_use_int8_products_close_to_fp32() {
    let e = embedder();
    let (texts, want) = reference();
    let q = e
        .embed_kind(&texts, &Cancel::new(), Kind::Query)
        .unwrap_or_default();
    let p = e
        .embed_kind(&texts, &Cancel::new(), Kind::Passage)
        .unwrap_or_default();
    assert_eq!(p.len(), texts.len());
    let mut lowest = 1f32;
    for ((t, w), (q, p)) in texts.iter().zip(&want).zip(q.iter().zip(&p)) {
        let (cq, cp) = (cos(q, w), cos(p, w));
        eprintln!("query {cq:.5}  passage {cp:.5}  {t}");
        assert!(cq >= 0.999, "query cosine {cq} for {t}");
        assert!(cp >= 0.98, "passage cosine {cp} for {t}");
        lowest = lowest.min(cos(q, p));
    }
    assert!(lowest < 0.9999, "passage and query vectors are identical");
}

/// A big (bulk) job is done batch by batch and a query that arrives in the
/// middle runs before the rest of it, instead of waiting for all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_overtake_a_bulk_ingest() {
    let svc = std::sync::Arc::new(EmbedService::new(
        load(),
        ServiceOptions {
            max_batch: 8,
            ..ServiceOptions::default()
        },
    ));
    let passages: Vec<String> = (0..96).map(|i| format!("{LONG} variant {i}")).collect();
    let bulk = {
        let (svc, p) = (svc.clone(), passages.clone());
        tokio::spawn(async move {
            let r = svc.embed(p, Cancel::new()).await;
            (r, std::time::Instant::now())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (q, _) = svc
        .embed_query("a short question", Cancel::new())
        .await
        .expect("query");
    let query_done = std::time::Instant::now();
    let (r, bulk_done) = bulk.await.expect("join");
    let vs = r.expect("bulk");
    assert!(
        query_done < bulk_done,
        "the query waited for the whole bulk job"
    );
    assert_eq!(q.len(), 384);
    // Results come back in the caller's order despite length-sorted batches.
    let direct = embedder()
        .embed(&passages[40..42], &Cancel::new())
        .unwrap_or_default();
    assert!(cos(&vs[40], &direct[0]) > 0.9999 && cos(&vs[41], &direct[1]) > 0.9999);
}

/// Queries that never let the queue empty (more clients than a batch
/// holds, each asking again as soon as it is answered) do not starve a
/// bulk job: it gets its batches in turn and finishes while they go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_ingest_finishes_under_an_endless_stream_of_queries() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let svc = std::sync::Arc::new(EmbedService::new(
        load(),
        ServiceOptions {
            max_batch: 4,
            ..ServiceOptions::default()
        },
    ));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..12)
        .map(|c| {
            let (svc, stop, asked) = (svc.clone(), stop.clone(), asked.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let q = format!("question {i} of client {c}");
                    svc.embed(vec![q], Cancel::new()).await.expect("query");
                    asked.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let before = asked.load(Ordering::Relaxed);
    let passages: Vec<String> = (0..24).map(|i| format!("{LONG} variant {i}")).collect();
    let bulk = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        svc.embed_passages(passages, Cancel::new()),
    )
    .await;
    let during = asked.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }
    let vs = bulk.expect("the bulk job was starved").expect("bulk");
    assert_eq!(vs.len(), 24);
    assert!(during >= 24, "queries went on meanwhile: {during}");
}

/// Concurrent query and passage requests are never merged into one batch:
/// each gets vectors from its own model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_keeps_queries_and_passages_apart() {
    let svc = std::sync::Arc::new(EmbedService::new(load(), ServiceOptions::default()));
    let (texts, _) = reference();
    let mut tasks = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let (svc, t) = (svc.clone(), t.clone());
        tasks.push(tokio::spawn(async move {
            let r = if i % 2 == 0 {
                svc.embed(vec![t], Cancel::new()).await
            } else {
                svc.embed_passages(vec![t], Cancel::new()).await
            };
            r.expect("embed").remove(0)
        }));
    }
    // Queries run fp32: exactly the vector of the text alone. Passages run
    // the int8 session, whose activation scale is per batch, so a passage
    // merged with others moves slightly (cosine ≥ 0.98 to the text alone);
    // at least one differs from its fp32 vector, so none took the query path.
    let mut passage_vs_fp32 = 1f32;
    for (i, task) in tasks.into_iter().enumerate() {
        let got = task.await.expect("join");
        let one = std::slice::from_ref(&texts[i]);
        let fp32 = embedder()
            .embed_kind(one, &Cancel::new(), Kind::Query)
            .unwrap_or_default();
        if i % 2 == 0 {
            let c = cos(&got, &fp32[0]);
            assert!(c > 0.9999, "query {i} got another model's vector: {c}");
        } else {
            let int8 = embedder()
                .embed_kind(one, &Cancel::new(), Kind::Passage)
                .unwrap_or_default();
            let c = cos(&got, &int8[0]);
            assert!(c >= 0.98, "passage {i}: cosine {c} to the int8 vector");
            passage_vs_fp32 = passage_vs_fp32.min(cos(&got, &fp32[0]));
        }
    }
    assert!(
        passage_vs_fp32 < 0.9999,
        "every passage got the fp32 query vector"
    );
}

/// The simplified graph computes what the exported one does: the hidden
/// states of every real token match (within float rounding) on a padded
/// batch of texts of different lengths, so masking, scale and head layout
/// of the fused attention are right.
#[test]
fn the_simplified_graph_computes_the_same_hidden_states() {
    use ragtime_onnx::{BertBatch, load_session_from_memory};
    let c = cache();
    let path = c.join("models/all-minilm-l6-v2/model.onnx");
    let lib = c.join("onnxruntime/libonnxruntime.so.1.31.1");
    let (bytes, mut model) = setup_model();
    let done = ragtime_onnx::simplify(&mut model).expect("simplify");
    assert_eq!(done.attentions, 6);
    let fused = model.encode_to_vec();
    let mut tok =
        tokenizers::Tokenizer::from_file(c.join("models/all-minilm-l6-v2/tokenizer.json"))
            .expect("tokenizer");
    tok.with_padding(None);
    tok.with_truncation(None).expect("no truncation");
    let texts = [
        "a",
        "Aspirin lowers the risk of a second heart attack in adults.",
        "The mitochondria is the powerhouse of the cell, and it has its own DNA, which is \
         inherited from the mother in most animals including humans and mice.",
    ];
    let enc = tok.encode_batch(texts.to_vec(), true).expect("encode");
    let batch = BertBatch::padded(&enc.iter().collect::<Vec<_>>());
    let hidden = |model: &[u8]| -> Vec<f32> {
        let mut s = load_session_from_memory(&lib, &path, model, 1).expect("session");
        let out = s
            .run(ort::inputs![
                "input_ids" => batch.tensor(&batch.ids).expect("ids"),
                "attention_mask" => batch.tensor(&batch.mask).expect("mask"),
                "token_type_ids" => batch.tensor(&batch.types).expect("types"),
            ])
            .expect("run");
        let h = out["last_hidden_state"]
            .try_extract_array::<f32>()
            .expect("f32");
        h.iter().copied().collect()
    };
    let (a, b) = (hidden(&bytes), hidden(&fused));
    assert_eq!(a.len(), b.len());
    let dim = a.len() / batch.mask.len();
    let mut compared = 0;
    for (t, &m) in batch.mask.iter().enumerate() {
        if m == 0 {
            continue;
        }
        for d in 0..dim {
            let (x, y) = (a[t * dim + d], b[t * dim + d]);
            assert!(
                (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                "token {t} dim {d}: {x} vs {y}"
            );
            compared += 1;
        }
    }
    assert!(
        compared > 40 * dim,
        "the batch holds texts of different lengths"
    );
}

/// The embedder loads the graphs it prepared beside the model (here in a
/// copy of the model folder): they give the vectors the graphs prepared in
/// memory give, for queries and passages.
#[test]
fn prepared_files_give_the_vectors_of_graphs_prepared_in_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let setup = cache().join("models/all-minilm-l6-v2");
    for f in ["model.onnx", "tokenizer.json"] {
        std::fs::copy(setup.join(f), dir.path().join(f)).expect("copy");
    }
    let opts = options(dir.path());
    let from_files = OnnxEmbedder::load(&opts).expect("load");
    // The first load wrote the graphs; preparing again reuses them.
    let model = dir.path().join("model.onnx");
    let prepared = ragtime_embed::prepare::prepare(&model).expect("prepare");
    assert_eq!(prepared.outcome, Outcome::Reused);
    assert!(prepared.query.path().is_file());
    assert!(
        prepared
            .passage_int8
            .as_ref()
            .is_some_and(|p| p.path().is_file())
    );
    let in_memory = ragtime_embed::prepare::prepare_in_memory(&model).expect("in memory");
    assert_eq!(in_memory.outcome, Outcome::InMemory);
    let from_memory = OnnxEmbedder::from_prepared(&opts, &in_memory).expect("load");
    assert!(from_files.passage_int8() && from_memory.passage_int8());
    let (texts, _) = reference();
    for kind in [Kind::Query, Kind::Passage] {
        let a = from_files
            .embed_kind(&texts, &Cancel::new(), kind)
            .expect("files");
        let b = from_memory
            .embed_kind(&texts, &Cancel::new(), kind)
            .expect("memory");
        assert_eq!(a, b, "{kind:?}");
    }
}

/// Ingestion's queue is bounded: a bulk job that would take it past
/// `max_bulk_texts` while another waits is refused (`Busy`, a 503 with
/// `Retry-After` at the API), and taken once the queue has drained; a job
/// alone in the queue is taken whatever its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_queue_is_bounded_and_pushes_back() {
    let svc = EmbedService::new(
        load(),
        ServiceOptions {
            max_batch: 4,
            max_bulk_texts: 10,
            ..ServiceOptions::default()
        },
    );
    let texts = |n: usize, tag: &str| -> Vec<String> {
        (0..n)
            .map(|i| format!("{tag} passage {i} about membranes and proteins"))
            .collect()
    };
    let (first, second) = tokio::join!(
        svc.embed_passages(texts(40, "first"), Cancel::new()),
        // Submitted in the same poll, while the first waits or runs.
        svc.embed_passages(texts(8, "second"), Cancel::new())
    );
    assert_eq!(first.expect("alone, taken whatever its size").len(), 40);
    assert!(matches!(second, Err(StageError::Busy(_))), "{second:?}");
    let again = svc.embed_passages(texts(8, "second"), Cancel::new()).await;
    assert_eq!(again.expect("taken once drained").len(), 8);
}
