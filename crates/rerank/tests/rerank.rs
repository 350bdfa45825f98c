//! The trained cross-encoder in `../shared/models/ce-minilm-l6/` (tests only).

use ragtime_core::{Cancel, StageError};
use ragtime_rerank::{CrossEncoder, RerankOptions};
use std::path::PathBuf;

fn cache() -> PathBuf {
    std::env::var_os("RAGTIME_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ragtime")
        })
}

/// The shared cross-encoder (`RAGTIME_TEST_RERANK_DIR`, set by `make test`
/// when `../shared/models/ce-minilm-l6` exists); `None` says the test did not run.
fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("RAGTIME_TEST_RERANK_DIR").map(PathBuf::from);
    if dir.is_none() {
        eprintln!("RAGTIME_TEST_RERANK_DIR is not set: reranking test did not run");
    }
    dir
}

fn load(file: &str) -> Option<CrossEncoder> {
    let ce = CrossEncoder::load(&RerankOptions {
        model_dir: model_dir()?,
        model_file: file.to_owned(),
        ort_lib: cache().join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: 2,
        max_tokens: 256,
    });
    Some(ce.unwrap_or_else(|e| panic!("the shared cross-encoder (RAGTIME_TEST_RERANK_DIR): {e}")))
}

const QUERY: &str = "Misfolded proteins are cleared by autophagy.";

fn passages() -> Vec<String> {
    [
        "Autophagy degrades protein aggregates: cells lacking autophagy genes accumulate misfolded proteins and inclusion bodies.",
        "The stock market closed higher on Friday as investors welcomed the earnings reports.",
        "Glaciers in the Alps have lost half of their volume since 1900.",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn the_relevant_passage_scores_highest_for_both_precisions() {
    for file in ["model.onnx", "model-int8.onnx"] {
        let Some(ce) = load(file) else { return };
        let s = ce
            .score(QUERY, &passages(), &Cancel::new())
            .unwrap_or_default();
        assert_eq!(s.len(), 3, "{file}");
        assert!(s[0] > s[1] && s[0] > s[2], "{file}: {s:?}");
    }
}

#[test]
fn batching_does_not_change_scores_and_cancel_is_honoured() {
    let Some(ce) = load("model.onnx") else { return };
    let all = ce
        .score(QUERY, &passages(), &Cancel::new())
        .unwrap_or_default();
    for (i, p) in passages().into_iter().enumerate() {
        let one = ce.score(QUERY, &[p], &Cancel::new()).unwrap_or_default();
        assert!(
            (one[0] - all[i]).abs() < 1e-3,
            "pair {i}: {} vs {}",
            one[0],
            all[i]
        );
    }
    let c = Cancel::new();
    c.cancel();
    assert_eq!(ce.score(QUERY, &passages(), &c), Err(StageError::Cancelled));
    assert_eq!(ce.score(QUERY, &[], &Cancel::new()), Ok(vec![]));
}

#[test]
fn a_folder_without_a_cross_encoder_is_a_clear_error() {
    let e = CrossEncoder::load(&RerankOptions {
        model_dir: cache().join("models/all-minilm-l6-v2"),
        model_file: "model.onnx".into(),
        ort_lib: cache().join("onnxruntime/libonnxruntime.so.1.31.1"),
        intra_threads: 1,
        max_tokens: 256,
    })
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("model.onnx"), "{e}");
}
