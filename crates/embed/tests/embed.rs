//! The real all-MiniLM-L6-v2 ONNX model from `make setup`.

use ragtime_core::{Cancel, Embedder, StageError};
use ragtime_embed::{EmbedderOptions, OnnxEmbedder};
use std::path::PathBuf;
use std::sync::OnceLock;

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

fn embedder() -> &'static OnnxEmbedder {
    static E: OnceLock<OnnxEmbedder> = OnceLock::new();
    E.get_or_init(|| {
        let c = cache();
        OnnxEmbedder::load(&EmbedderOptions {
            model_dir: c.join("models/all-minilm-l6-v2"),
            ort_lib: c.join("onnxruntime/libonnxruntime.so.1.31.1"),
            intra_threads: 1,
            max_tokens: 256,
            batch_size: 8,
        })
        .unwrap_or_else(|e| panic!("load the model with `make setup` first: {e}"))
    })
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
        .embed(&[short.clone()], &Cancel::new())
        .unwrap_or_default();
    let padded = e.embed(&[long, short], &Cancel::new()).unwrap_or_default();
    let c = cos(&alone[0], &padded[1]);
    assert!(c > 0.9999, "padding changed the vector: cosine {c}");
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
