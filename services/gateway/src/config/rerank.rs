//! `[rerank]`: the optional cross-encoder.

use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RerankConfig {
    /// A BERT-style cross-encoder exported to ONNX (`RAGTIME__RERANK__MODEL_DIR`):
    /// its ONNX file and `tokenizer.json`. Unset: no reranking.
    pub model_dir: Option<PathBuf>,
    /// The ONNX file in `model_dir`; empty: `model-int8.onnx` where there
    /// is one (about twice as fast on CPU, so the default budget scores
    /// every candidate), else `model.onnx`.
    pub model_file: String,
    /// Candidates reranked, best-first by retrieval rank.
    pub depth: usize,
    /// Pairs per model call (the granularity of anytime reranking).
    pub batch: usize,
    /// Weight of the cross-encoder score in the final blend (0–1).
    pub weight: f32,
    pub max_tokens: usize,
}

impl Default for RerankConfig {
    fn default() -> Self {
        Self {
            model_dir: None,
            model_file: String::new(),
            depth: 20,
            batch: 4,
            weight: ragtime_pipeline::rerank::DEFAULT_WEIGHT,
            max_tokens: 256,
        }
    }
}

impl RerankConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.weight) {
            return Err(invalid("rerank.weight", "must be between 0 and 1"));
        }
        if !(1..=200).contains(&self.depth) || !(1..=64).contains(&self.batch) {
            return Err(invalid(
                "rerank.depth",
                "rerank.depth must be 1–200 and rerank.batch 1–64",
            ));
        }
        Ok(())
    }
}
