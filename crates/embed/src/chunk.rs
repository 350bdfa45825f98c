//! Token-aware chunking with overlap, using the embedding model's own
//! tokenizer so every chunk fits the model's window.

use tokenizers::Tokenizer;

/// A piece of a document's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextChunk {
    pub text: String,
    /// Word-piece tokens in the chunk (without special tokens).
    pub tokens: usize,
    /// Byte range in the source text.
    pub start: usize,
    pub end: usize,
}

/// Splits text into windows of at most `max_tokens` tokens that overlap by
/// about `overlap` tokens. Windows end at a sentence end when one falls in
/// their last third, and never inside a word.
pub struct Chunker {
    tokenizer: Tokenizer,
    max_tokens: usize,
    overlap: usize,
}

impl Chunker {
    pub fn new(mut tokenizer: Tokenizer, max_tokens: usize, overlap: usize) -> Self {
        tokenizer.with_padding(None);
        let _ = tokenizer.with_truncation(None);
        Self {
            tokenizer,
            max_tokens: max_tokens.max(8),
            overlap: overlap.min(max_tokens / 2),
        }
    }

    /// A chunker on the `tokenizer.json` at `path`.
    pub fn from_file(
        path: &std::path::Path,
        max_tokens: usize,
        overlap: usize,
    ) -> Result<Self, crate::LoadError> {
        let t = Tokenizer::from_file(path).map_err(|e| crate::LoadError::File {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Ok(Self::new(t, max_tokens, overlap))
    }

    pub fn chunk(&self, text: &str) -> Vec<TextChunk> {
        let Ok(enc) = self.tokenizer.encode(text, false) else {
            return vec![TextChunk {
                text: text.to_owned(),
                tokens: 0,
                start: 0,
                end: text.len(),
            }];
        };
        let offsets = enc.get_offsets();
        let n = offsets.len();
        if n == 0 {
            return Vec::new();
        }
        // Token i continues a word when it starts where the previous ended.
        let continues = |i: usize| i > 0 && i < n && offsets[i].0 == offsets[i - 1].1;
        let sentence_end = |i: usize| {
            let (s, e) = offsets[i];
            matches!(&text[s..e], "." | "!" | "?" | ";") || text[e..].starts_with('\n')
        };
        let mut chunks = Vec::new();
        let mut start = 0usize;
        loop {
            let mut end = (start + self.max_tokens).min(n);
            if end < n {
                // Prefer a sentence end in the last third of the window.
                let floor = start + self.max_tokens * 2 / 3;
                if let Some(i) = (floor..end).rev().find(|&i| sentence_end(i)) {
                    end = i + 1;
                } else {
                    while end > start + 1 && continues(end) {
                        end -= 1;
                    }
                }
            }
            let (bs, be) = (offsets[start].0, offsets[end - 1].1);
            chunks.push(TextChunk {
                text: text[bs..be].to_owned(),
                tokens: end - start,
                start: bs,
                end: be,
            });
            if end >= n {
                break;
            }
            let mut next = end.saturating_sub(self.overlap).max(start + 1);
            while next < end && continues(next) {
                next += 1;
            }
            start = next;
        }
        chunks
    }
}
