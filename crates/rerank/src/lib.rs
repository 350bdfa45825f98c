//! A BERT-style cross-encoder exported to ONNX (`model.onnx` with inputs
//! `input_ids`, `attention_mask`, `token_type_ids` and one logit per pair,
//! plus `tokenizer.json`), scoring (query, passage) pairs in small batches.
//! Scores are only comparable within one query.

use ort::session::Session;
use ragtime_core::{Cancel, StageError};
use ragtime_onnx::{BertBatch, configure_tokenizer, load_session};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use thiserror::Error;
use tokenizers::{Tokenizer, TruncationStrategy};

#[derive(Debug, Error)]
pub enum RerankLoadError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error(transparent)]
    Load(#[from] ragtime_onnx::LoadError),
}

/// Settings for [`CrossEncoder::load`].
#[derive(Debug, Clone)]
pub struct RerankOptions {
    /// Folder with `model.onnx` (or `model_file`) and `tokenizer.json`.
    pub model_dir: PathBuf,
    /// The ONNX file inside `model_dir` (e.g. `model-int8.onnx`).
    pub model_file: String,
    pub ort_lib: PathBuf,
    pub intra_threads: usize,
    /// Longest pair in tokens (longest-first truncation).
    pub max_tokens: usize,
}

pub struct CrossEncoder {
    session: Mutex<Session>,
    tokenizer: Tokenizer,
    output: String,
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> RerankLoadError {
    RerankLoadError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

impl CrossEncoder {
    pub fn load(opts: &RerankOptions) -> Result<Self, RerankLoadError> {
        let model = opts.model_dir.join(&opts.model_file);
        let tok_path = opts.model_dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| file_err(&tok_path, e))?;
        configure_tokenizer(
            &mut tokenizer,
            &tok_path,
            opts.max_tokens,
            TruncationStrategy::LongestFirst,
        )?;
        let session = load_session(&opts.ort_lib, &model, opts.intra_threads)?;
        let names: Vec<String> = session
            .inputs()
            .iter()
            .map(|i| i.name().to_owned())
            .collect();
        for want in ["input_ids", "attention_mask", "token_type_ids"] {
            if !names.iter().any(|n| n == want) {
                return Err(file_err(
                    &model,
                    format!("not a BERT cross-encoder: no input {want:?} (inputs: {names:?})"),
                ));
            }
        }
        let output = session
            .outputs()
            .first()
            .map(|o| o.name().to_owned())
            .ok_or_else(|| file_err(&model, "model has no outputs"))?;
        let me = Self {
            session: Mutex::new(session),
            tokenizer,
            output,
        };
        // Warm up once.
        me.score("warm up", &["a passage".to_owned()], &Cancel::new())
            .map_err(|e| file_err(&model, e))?;
        Ok(me)
    }

    /// One logit per passage for `query` (higher = more relevant). Checks
    /// `cancel` before tokenizing and again once it holds the session.
    pub fn score(
        &self,
        query: &str,
        passages: &[String],
        cancel: &Cancel,
    ) -> Result<Vec<f32>, StageError> {
        if passages.is_empty() {
            return Ok(Vec::new());
        }
        if cancel.is_cancelled() {
            return Err(StageError::Cancelled);
        }
        let backend = |e: &dyn std::fmt::Display| StageError::Backend(format!("rerank: {e}"));
        let pairs: Vec<tokenizers::EncodeInput> = passages
            .iter()
            .map(|p| (query.to_owned(), p.clone()).into())
            .collect();
        let enc = self
            .tokenizer
            .encode_batch(pairs, true)
            .map_err(|e| backend(&e))?;
        let inputs = BertBatch::new(&enc);
        let batch = inputs.batch;
        let t = |v: &[i64]| inputs.tensor(v).map_err(|e| backend(&e));
        let mut session = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        // The wait for the session may have outlasted the stage.
        if cancel.is_cancelled() {
            return Err(StageError::Cancelled);
        }
        let out = session
            .run(ort::inputs![
                "input_ids" => t(&inputs.ids)?,
                "attention_mask" => t(&inputs.mask)?,
                "token_type_ids" => t(&inputs.types)?,
            ])
            .map_err(|e| backend(&e))?;
        let (_, logits) = out[self.output.as_str()]
            .try_extract_tensor::<f32>()
            .map_err(|e| backend(&e))?;
        if logits.len() != batch {
            return Err(StageError::Backend(format!(
                "rerank: {} logits for {batch} pairs",
                logits.len()
            )));
        }
        Ok(logits.to_vec())
    }
}
