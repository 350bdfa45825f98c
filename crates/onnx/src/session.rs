//! ONNX Runtime for BERT-style models: the one environment of the
//! process, optimised sessions, tokenizer settings and padded input
//! batches, shared by the embedder and the cross-encoder.

use crate::prepare::PrepareError;
use ort::environment::Environment;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("onnx runtime: {0}")]
    Ort(String),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
}

static ENV: OnceLock<Environment> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Loads `libonnxruntime` from `lib` (once per process) and returns the
/// shared environment. Later calls return the first environment.
pub fn ort_environment(lib: &Path) -> Result<Environment, LoadError> {
    if let Some(env) = ENV.get() {
        return Ok(env.clone());
    }
    let _guard = INIT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(env) = ENV.get() {
        return Ok(env.clone());
    }
    if !lib.is_file() {
        return Err(LoadError::File {
            path: lib.to_owned(),
            message: "ONNX Runtime library not found (run `make setup`)".into(),
        });
    }
    let env = ort::init_from(lib)
        .map_err(|e| LoadError::File {
            path: lib.to_owned(),
            message: e.to_string(),
        })?
        .with_name("ragtime")
        .build()
        .map_err(|e| LoadError::Ort(e.to_string()))?;
    Ok(ENV.get_or_init(|| env).clone())
}

/// Sets the truncation and batch padding ragtime uses on a model's
/// `tokenizer.json` (whose own settings differ per model).
pub fn configure_tokenizer(
    tokenizer: &mut tokenizers::Tokenizer,
    path: &Path,
    max_tokens: usize,
    strategy: tokenizers::TruncationStrategy,
) -> Result<(), LoadError> {
    tokenizer
        .with_truncation(Some(tokenizers::TruncationParams {
            max_length: max_tokens,
            strategy,
            ..tokenizers::TruncationParams::default()
        }))
        .map_err(|e| LoadError::File {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    tokenizer.with_padding(Some(tokenizers::PaddingParams {
        strategy: tokenizers::PaddingStrategy::BatchLongest,
        ..tokenizers::PaddingParams::default()
    }));
    Ok(())
}

/// An optimised ONNX Runtime session for `model` on the shared environment.
pub fn load_session(
    ort_lib: &Path,
    model: &Path,
    intra_threads: usize,
) -> Result<ort::session::Session, LoadError> {
    build_session(ort_lib, model, None, intra_threads)
}

/// As [`load_session`], for a model held in memory (`path` names it in
/// errors).
pub fn load_session_from_memory(
    ort_lib: &Path,
    path: &Path,
    bytes: &[u8],
    intra_threads: usize,
) -> Result<ort::session::Session, LoadError> {
    build_session(ort_lib, path, Some(bytes), intra_threads)
}

fn build_session(
    ort_lib: &Path,
    model: &Path,
    bytes: Option<&[u8]>,
    intra_threads: usize,
) -> Result<ort::session::Session, LoadError> {
    let env = ort_environment(ort_lib)?;
    let file_err = |e: String| LoadError::File {
        path: model.to_owned(),
        message: e,
    };
    let mut builder = ort::session::Session::builder(&env)
        .map_err(|e| LoadError::Ort(e.to_string()))?
        .with_optimization_level(ort::session::builder::GraphOptimizationLevel::Level3)
        .map_err(|e| LoadError::Ort(e.to_string()))?
        .with_intra_threads(intra_threads.max(1))
        .map_err(|e| LoadError::Ort(e.to_string()))?;
    match bytes {
        Some(b) => builder.commit_from_memory(b),
        None => builder.commit_from_file(model),
    }
    .map_err(|e| file_err(e.to_string()))
}

/// The BERT inputs of a padded batch of encodings, row-major `[batch, seq]`.
pub struct BertBatch {
    pub batch: usize,
    pub seq: usize,
    pub ids: Vec<i64>,
    pub mask: Vec<i64>,
    pub types: Vec<i64>,
}

impl BertBatch {
    /// A batch of encodings (already padded to one length, or padded here).
    pub fn new(encodings: &[tokenizers::Encoding]) -> Self {
        Self::padded(&encodings.iter().collect::<Vec<_>>())
    }

    /// A batch of unpadded encodings, padded to the longest (id, mask and
    /// type 0), as a `BatchLongest` tokenizer would.
    pub fn padded(encodings: &[&tokenizers::Encoding]) -> Self {
        let batch = encodings.len();
        let seq = encodings.iter().map(|e| e.len()).max().unwrap_or(0);
        let mut b = Self {
            batch,
            seq,
            ids: vec![0; batch * seq],
            mask: vec![0; batch * seq],
            types: vec![0; batch * seq],
        };
        for (row, e) in encodings.iter().enumerate() {
            let at = row * seq;
            let put = |dst: &mut [i64], src: &[u32]| {
                for (d, &x) in dst.iter_mut().zip(src) {
                    *d = i64::from(x);
                }
            };
            put(&mut b.ids[at..at + seq], e.get_ids());
            put(&mut b.mask[at..at + seq], e.get_attention_mask());
            put(&mut b.types[at..at + seq], e.get_type_ids());
        }
        b
    }

    /// One input as an ONNX tensor.
    pub fn tensor(&self, v: &[i64]) -> ort::Result<ort::value::Tensor<i64>> {
        ort::value::Tensor::from_array(([self.batch, self.seq], v.to_vec()))
    }
}
