//! all-MiniLM-L6-v2 sentence embeddings through ONNX Runtime (`ort`).
//!
//! Mean pooling over the last hidden state with the attention mask, then L2
//! normalisation, as sentence-transformers does for this model. The model's
//! graph is rewritten for speed by `ragtime-onnx` once, beside the model
//! (see [`prepare`]), and every start loads the prepared graphs.

mod chunk;
mod service;

pub use chunk::{Chunker, TextChunk};
pub use ragtime_onnx::LoadError;
/// Preparing a model's rewritten graphs once (`ragtime prepare-model`).
pub use ragtime_onnx::prepare;
pub use service::{EmbedService, ServiceOptions, normalise_text};

use ort::session::Session;
use ragtime_core::{Cancel, StageError};
use ragtime_onnx::prepare::Prepared;
use ragtime_onnx::{BertBatch, configure_tokenizer};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tokenizers::{Tokenizer, TruncationStrategy};

/// Settings for [`OnnxEmbedder::load`].
#[derive(Debug, Clone)]
pub struct EmbedderOptions {
    /// Folder with `model.onnx` and `tokenizer.json`.
    pub model_dir: PathBuf,
    /// `libonnxruntime.so` to load.
    pub ort_lib: PathBuf,
    /// ONNX Runtime intra-op threads per inference.
    pub intra_threads: usize,
    /// Longest input in tokens; longer inputs are truncated.
    pub max_tokens: usize,
    /// Texts per inference call.
    pub batch_size: usize,
    /// Padded tokens per inference call (texts × longest): small batches
    /// keep activations in cache, which is faster on CPU than large ones.
    pub max_batch_tokens: usize,
    /// Embed passages (ingestion) with int8 matrix products (about twice
    /// the throughput, cosine ≈ 0.995 to fp32); queries always use fp32.
    pub passage_int8: bool,
}

/// What a text is: queries are embedded in fp32, passages with the
/// passage model (int8 compute when enabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Query,
    Passage,
}

/// The embedding model. `embed` is synchronous and CPU-bound: call it from a
/// blocking thread.
pub struct OnnxEmbedder {
    session: Mutex<Session>,
    /// The int8-compute session for passages, when enabled.
    passages: Option<Mutex<Session>>,
    /// The raw tokenizer (for chunking).
    raw_tokenizer: Tokenizer,
    tokenizer: Tokenizer,
    dim: usize,
    batch_size: usize,
    max_batch_tokens: usize,
    has_token_types: bool,
    output: String,
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> LoadError {
    LoadError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// The model's tokenizer as is (for chunking) and set up for embedding.
struct Tokenizers {
    raw: Tokenizer,
    tokenizer: Tokenizer,
}

impl Tokenizers {
    fn load(opts: &EmbedderOptions) -> Result<Self, LoadError> {
        let tok_path = opts.model_dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| file_err(&tok_path, e))?;
        let raw = tokenizer.clone();
        // tokenizer.json pins padding and truncation to 128: set both here.
        configure_tokenizer(
            &mut tokenizer,
            &tok_path,
            opts.max_tokens,
            TruncationStrategy::LongestFirst,
        )?;
        // Batches are padded here, after grouping texts by token count.
        tokenizer.with_padding(None);
        Ok(Self { raw, tokenizer })
    }
}

impl OnnxEmbedder {
    /// Loads the model in `opts.model_dir` from its prepared graphs: those
    /// written beside it for its checksum, prepared and written now when
    /// there are none, or prepared in memory when the folder cannot be
    /// written.
    pub fn load(opts: &EmbedderOptions) -> Result<Self, LoadError> {
        let model = opts.model_dir.join("model.onnx");
        if !model.is_file() {
            return Err(file_err(&model, "model file not found (run `make setup`)"));
        }
        let tokenizers = Tokenizers::load(opts)?;
        let prepared = prepare::load_or_prepare(&model)?;
        Self::build(opts, tokenizers, &prepared)
    }

    /// Loads the model from graphs prepared from `opts.model_dir`'s
    /// `model.onnx` (see [`prepare`]).
    pub fn from_prepared(opts: &EmbedderOptions, prepared: &Prepared) -> Result<Self, LoadError> {
        Self::build(opts, Tokenizers::load(opts)?, prepared)
    }

    fn build(
        opts: &EmbedderOptions,
        Tokenizers { raw, tokenizer }: Tokenizers,
        prepared: &Prepared,
    ) -> Result<Self, LoadError> {
        let model = prepared.query.path();
        let s = prepared.simplified;
        tracing::info!(
            attentions = s.attentions,
            nan_guards = s.nan_guards,
            gelus = s.gelus,
            outcome = ?prepared.outcome,
            "embedding graph simplified"
        );
        let session = prepared.query.session(&opts.ort_lib, opts.intra_threads)?;
        let passages = match (&prepared.passage_int8, opts.passage_int8) {
            (_, false) => None,
            (None, true) => {
                tracing::warn!(model = %prepared.source.display(), "no int8 weights to compute with: passages use fp32");
                None
            }
            (Some(int8), true) => {
                let rewritten = prepared.int8_products;
                tracing::info!(rewritten, "passages embedded with int8 matrix products");
                Some(Mutex::new(int8.session(&opts.ort_lib, opts.intra_threads)?))
            }
        };
        let has_token_types = session
            .inputs()
            .iter()
            .any(|i| i.name() == "token_type_ids");
        let output = session
            .outputs()
            .iter()
            .map(|o| o.name().to_owned())
            .find(|n| n == "last_hidden_state" || n == "token_embeddings")
            .or_else(|| session.outputs().first().map(|o| o.name().to_owned()))
            .ok_or_else(|| file_err(model, "model has no outputs"))?;
        tracing::info!(
            model = %model.display(),
            inputs = ?session.inputs().iter().map(|i| i.name().to_owned()).collect::<Vec<_>>(),
            output = %output,
            "embedding model loaded"
        );
        let mut me = Self {
            session: Mutex::new(session),
            passages,
            raw_tokenizer: raw,
            tokenizer,
            dim: 0,
            batch_size: opts.batch_size.max(1),
            max_batch_tokens: opts.max_batch_tokens.max(1),
            has_token_types,
            output,
        };
        // Warm up once (and learn the dimension).
        let v = me
            .embed(&["warm up".to_owned()], &Cancel::new())
            .map_err(|e| file_err(model, e))?;
        me.dim = v.first().map_or(0, Vec::len);
        if me.passages.is_some() {
            me.embed_kind(&["warm up".to_owned()], &Cancel::new(), Kind::Passage)
                .map_err(|e| file_err(model, e))?;
        }
        Ok(me)
    }

    /// A chunker that splits text with this model's tokenizer.
    pub fn chunker(&self, max_tokens: usize, overlap: usize) -> Chunker {
        Chunker::new(self.raw_tokenizer.clone(), max_tokens, overlap)
    }

    /// Whether passages are embedded with int8 matrix products.
    pub fn passage_int8(&self) -> bool {
        self.passages.is_some()
    }

    fn embed_batch(
        &self,
        encodings: &[&tokenizers::Encoding],
        kind: Kind,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        let backend = |e: &dyn std::fmt::Display| StageError::Backend(format!("embedding: {e}"));
        let inputs = BertBatch::padded(encodings);
        let (batch, seq) = (inputs.batch, inputs.seq);
        let t = |v: &[i64]| inputs.tensor(v).map_err(|e| backend(&e));
        let session = match (kind, &self.passages) {
            (Kind::Passage, Some(p)) => p,
            _ => &self.session,
        };
        let mut session = session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let outputs = if self.has_token_types {
            session.run(ort::inputs![
                "input_ids" => t(&inputs.ids)?,
                "attention_mask" => t(&inputs.mask)?,
                "token_type_ids" => t(&inputs.types)?,
            ])
        } else {
            session.run(ort::inputs![
                "input_ids" => t(&inputs.ids)?,
                "attention_mask" => t(&inputs.mask)?,
            ])
        }
        .map_err(|e| backend(&e))?;
        let hidden = outputs[self.output.as_str()]
            .try_extract_array::<f32>()
            .map_err(|e| backend(&e))?;
        let shape = hidden.shape().to_vec();
        if shape.len() == 2 {
            // Already pooled.
            return Ok(hidden
                .rows_or_panic_free(&shape)
                .into_iter()
                .map(normalise)
                .collect());
        }
        if shape.len() != 3 || shape[0] != batch || shape[1] != seq {
            return Err(StageError::Backend(format!(
                "embedding: unexpected output shape {shape:?}"
            )));
        }
        let dim = shape[2];
        let mut out = Vec::with_capacity(batch);
        for b in 0..batch {
            let mut acc = vec![0f32; dim];
            let mut n = 0f32;
            for s in 0..seq {
                if inputs.mask[b * seq + s] == 0 {
                    continue;
                }
                n += 1.0;
                for (d, a) in acc.iter_mut().enumerate() {
                    *a += hidden[[b, s, d]];
                }
            }
            let n = n.max(1.0);
            acc.iter_mut().for_each(|a| *a /= n);
            out.push(normalise(acc));
        }
        Ok(out)
    }
}

trait Rows {
    fn rows_or_panic_free(&self, shape: &[usize]) -> Vec<Vec<f32>>;
}

impl Rows for ndarray::ArrayViewD<'_, f32> {
    fn rows_or_panic_free(&self, shape: &[usize]) -> Vec<Vec<f32>> {
        (0..shape[0])
            .map(|b| (0..shape[1]).map(|d| self[[b, d]]).collect())
            .collect()
    }
}

fn normalise(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

impl OnnxEmbedder {
    /// Dimension of the vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Embeds texts as queries (fp32), on the calling thread.
    pub fn embed(&self, texts: &[String], cancel: &Cancel) -> Result<Vec<Vec<f32>>, StageError> {
        self.embed_kind(texts, cancel, Kind::Query)
    }
}

impl OnnxEmbedder {
    /// Embeds texts as queries or passages (see [`Kind`]), in batches of
    /// similar length: at most `batch_size` texts and `max_batch_tokens`
    /// padded tokens each.
    pub fn embed_kind(
        &self,
        texts: &[String],
        cancel: &Cancel,
        kind: Kind,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        if let Some(i) = texts.iter().position(|t| t.trim().is_empty()) {
            return Err(StageError::InvalidInput(format!("text {i} is empty")));
        }
        if cancel.is_cancelled() {
            return Err(StageError::Cancelled);
        }
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| StageError::Backend(format!("embedding: {e}")))?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for idx in batches(
            &order,
            |i| encodings[i].len(),
            self.batch_size,
            self.max_batch_tokens,
        ) {
            if cancel.is_cancelled() {
                return Err(StageError::Cancelled);
            }
            let batch: Vec<&tokenizers::Encoding> = idx.iter().map(|&i| &encodings[i]).collect();
            for (&i, v) in idx.iter().zip(self.embed_batch(&batch, kind)?) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

/// Splits `order` (sorted by length, shortest first) into consecutive
/// batches of at most `max_texts` texts whose padded size (texts × longest)
/// stays within `max_tokens`; a text longer than `max_tokens` goes alone.
fn batches(
    order: &[usize],
    len: impl Fn(usize) -> usize,
    max_texts: usize,
    max_tokens: usize,
) -> Vec<&[usize]> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len()
            && end - start < max_texts
            && (end - start + 1) * len(order[end]) <= max_tokens
        {
            end += 1;
        }
        out.push(&order[start..end]);
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::batches;

    #[test]
    fn batches_respect_the_text_and_token_limits() {
        let lens = [3, 3, 4, 10, 10, 10, 40];
        let order: Vec<usize> = (0..lens.len()).collect();
        let got = batches(&order, |i| lens[i], 4, 24);
        // 3 texts × 4 tokens fit, a fourth (10 tokens) would pad to 40;
        // two 10s fit (20), a third would be 30; 40 goes alone.
        assert_eq!(got, [&[0, 1, 2][..], &[3, 4], &[5], &[6]]);
        let got = batches(&order, |i| lens[i], 2, 1000);
        assert_eq!(got, [&[0, 1][..], &[2, 3], &[4, 5], &[6]]);
        assert!(batches(&[], |_| 1, 4, 4).is_empty());
    }
}
