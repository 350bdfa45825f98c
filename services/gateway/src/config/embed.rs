//! `[embed]`: the local embedding model and its batching.

use super::cache_dir;
use super::{ConfigError, invalid};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbedConfig {
    /// Folder with `model.onnx` and `tokenizer.json`.
    pub model_dir: PathBuf,
    /// The ONNX Runtime shared library.
    pub ort_lib: PathBuf,
    pub intra_threads: usize,
    pub max_tokens: usize,
    /// Most texts in one inference (micro-batches merge up to this).
    pub batch_size: usize,
    /// Most padded tokens in one inference (texts × longest).
    pub max_batch_tokens: usize,
    /// Embedding worker threads.
    pub workers: usize,
    /// How long a worker waits for concurrent requests to fill a batch (µs).
    pub batch_wait_us: u64,
    /// Query-embedding cache bounds.
    pub cache_entries: u64,
    pub cache_ttl_s: u64,
    /// Passage texts ingestion may queue for embedding; an ingest that
    /// would pass it while others wait answers 503 with `Retry-After`.
    pub max_queued_texts: usize,
    /// Embed passages at ingestion with int8 matrix products: about twice
    /// the ingest throughput, at a cosine of ≈ 0.995 to fp32 and no
    /// measurable change in retrieval quality. Queries always use fp32.
    pub passage_int8: bool,
}

impl Default for EmbedConfig {
    fn default() -> Self {
        let c = cache_dir();
        Self {
            model_dir: c.join("models/all-minilm-l6-v2"),
            ort_lib: c.join("onnxruntime/libonnxruntime.so.1.31.1"),
            intra_threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(2)),
            max_tokens: 256,
            batch_size: 32,
            max_batch_tokens: 1024,
            workers: 1,
            batch_wait_us: 0,
            cache_entries: 100_000,
            cache_ttl_s: 3600,
            max_queued_texts: 50_000,
            passage_int8: true,
        }
    }
}

impl EmbedConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=64).contains(&self.intra_threads) {
            return Err(invalid("embed.intra_threads", "must be between 1 and 64"));
        }
        if !(8..=512).contains(&self.max_tokens) {
            return Err(invalid("embed.max_tokens", "must be between 8 and 512"));
        }
        if !(1..=1024).contains(&self.batch_size) {
            return Err(invalid("embed.batch_size", "must be between 1 and 1024"));
        }
        if !(16..=1_048_576).contains(&self.max_batch_tokens) {
            return Err(invalid(
                "embed.max_batch_tokens",
                "must be between 16 and 1048576",
            ));
        }
        if !(1..=8).contains(&self.workers) {
            return Err(invalid("embed.workers", "must be between 1 and 8"));
        }
        Ok(())
    }
}
